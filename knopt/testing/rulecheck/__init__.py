"""The rule checker: is every rule sound on random instances of its left side?

`check_rules(...)` checks the shipped rules and users' rule files (what `knopt check-rules`
runs); `check_rule(...)` checks one rule. Each rule's query is instantiated with random shapes,
dtypes and values that meet its guards, the rule is applied alone, and both sides (or the facts
it derives) are compared on the CPU executor.

Modules, by job: `sexpr` and `rulebook` read rule files; `unfold` and `pattern` turn a query
into something to build; `sampler`, `draft`, `build`, `conditions`, `repair` and `instance`
build one instance, and `draw` draws a rule's instances; `checkrun` applies the rule alone;
`values`, `facts`, `oracle` and `judge` compare; `report` and `check` give the verdicts.
"""

from knopt.testing.rulecheck.check import check_rule, check_rules
from knopt.testing.rulecheck.report import SOUND, UNCHECKED, UNSOUND, RuleReport

__all__ = ["SOUND", "UNCHECKED", "UNSOUND", "RuleReport", "check_rule", "check_rules"]
