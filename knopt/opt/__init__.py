"""The optimizer: IR graphs as egglog terms, saturation under rules/*.egg, cost-based extraction.

    result = knopt.optimize(graph, profile="h200")   # knopt.opt.optimize.optimize
    print(knopt.opt.format_report(result.report))

`optimize` returns the optimized graph, its kernel `Program` and a report; `knopt.save`
writes the result as ONNX. (The function is not re-exported here: the name `optimize` in this
package is its module.)
"""

from knopt.opt.cost import PROFILES, DeviceProfile, find_profile, load_profile
from knopt.opt.egraph import DEFAULT_LIMITS, Limits
from knopt.opt.explain import format_report
from knopt.opt.optimize import OptimizeResult
from knopt.opt.report import OptimizeReport, Pattern
from knopt.opt.rules import RuleFile, read_rule_file, shipped_rule_files

__all__ = [
    "DEFAULT_LIMITS",
    "PROFILES",
    "DeviceProfile",
    "Limits",
    "OptimizeReport",
    "OptimizeResult",
    "Pattern",
    "RuleFile",
    "find_profile",
    "format_report",
    "load_profile",
    "read_rule_file",
    "shipped_rule_files",
]
