"""Write a rewrite rule, check that it is sound, and optimize a model with it.

    python examples/custom_rule.py

The rule, in `examples/abs.egg`, says |-x| = |x| (a negation under an absolute value does
nothing, for floats). The rule checker (`knopt check-rules examples/abs.egg` from the shell)
tries it on random instances; then a model with `Abs(Neg(x))` is optimized with the rule, and
the report says it fired.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import knopt
from knopt.opt import read_rule_file
from knopt.testing.rulecheck import SOUND, check_rules

RULE = Path(__file__).with_name("abs.egg")  # |-x| = |x|, for floats


def model_bytes() -> bytes:
    """The model `y = |-x| + |-x|`, for x of shape [4, 8]."""
    nodes = [
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Abs", ["n"], ["a"]),
        helper.make_node("Add", ["a", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "abs_neg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return model.SerializeToString()


def main() -> None:
    """Check the rule, then optimize with it and run the result."""
    (report,) = check_rules([read_rule_file(RULE)], only_extra=True, instances=8)
    print(report.line())
    assert report.verdict == SOUND

    graph = knopt.load(model_bytes())
    result = knopt.optimize(graph, rules=[RULE])
    fired = result.report.rules_fired.get("abs-of-neg", 0)
    print(f"{result!r}; abs-of-neg fired {fired} time(s)")
    assert fired >= 1

    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    (y,) = knopt.compile(result.graph).run(None, {"x": x})
    np.testing.assert_allclose(y, 2 * np.abs(x))
    print("the optimized graph computes 2 * |x|")


if __name__ == "__main__":
    main()
