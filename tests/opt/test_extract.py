"""Extraction on hand-made e-graphs: DAG cost, acyclicity, the ILP, and cost-driven choices."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from knopt.errors import OptimizeError
from knopt.opt.extract import check_extraction, extract
from knopt.opt.ilp import dag_cost, solve_ilp
from knopt.opt.serialized import EGraphData, ENode, Ref

Cost = Callable[[int, ENode], float]
LEAF = ENode("Input", ("x",))


def _node(op: str, *children: int) -> ENode:
    return ENode(op, tuple(Ref(c) for c in children))


def _costs(table: Mapping[str, float]) -> Cost:
    """Costs by op name; the leaf is free."""
    return lambda cls, node: table.get(node.op, 0.0)


# Class 1 is a shared intermediate read by classes 2 and 3, which can each also be computed
# from the leaf directly (B2, C2) for 7. Sharing costs A once plus 1 + 1; tree cost would
# charge A twice.
SHARED = EGraphData(
    classes={
        0: [LEAF],
        1: [_node("A", 0)],
        2: [_node("B", 1), _node("B2", 0)],
        3: [_node("C", 1), _node("C2", 0)],
        4: [_node("D", 2, 3)],
    }
)
SHARED_ORIGINAL = [
    (0, LEAF),
    (1, _node("A", 0)),
    (2, _node("B", 1)),
    (3, _node("C", 1)),
    (4, _node("D", 2, 3)),
]

# Classes 1 and 2 can each be computed for free from the other, or for 5 from the leaf:
# the free pair is a cycle.
CYCLIC = EGraphData(
    classes={
        0: [LEAF],
        1: [_node("X", 2), _node("Y", 0), _node("Self", 1)],
        2: [_node("Z", 1), _node("W", 0)],
        3: [_node("R", 1, 2)],
    }
)
CYCLIC_COSTS = _costs({"Y": 5.0, "W": 5.0, "R": 1.0})
CYCLIC_ORIGINAL = [(0, LEAF), (1, _node("Y", 0)), (2, _node("W", 0)), (3, _node("R", 1, 2))]


def _ops(choice: Mapping[int, ENode]) -> set[str]:
    return {node.op for node in choice.values()}


def test_shared_intermediate_is_paid_once() -> None:
    cost = _costs({"A": 10.0, "B": 1.0, "C": 1.0, "B2": 7.0, "C2": 7.0, "D": 1.0})
    result = extract(SHARED, [4], cost, SHARED_ORIGINAL, ilp_max_nodes=0)
    assert _ops(result.choice) == {"Input", "A", "B", "C", "D"}
    assert result.cost == pytest.approx(13.0)
    assert dag_cost(result.choice, [4], cost) == pytest.approx(13.0)


@pytest.mark.parametrize(
    ("shared_cost", "expected", "total"),
    [(2.0, {"A", "B", "C"}, 5.0), (100.0, {"B2", "C2"}, 15.0)],
    ids=["cheap-shared", "expensive-shared"],
)
@pytest.mark.parametrize("ilp", [False, True], ids=["local-search", "ilp"])
def test_extraction_follows_the_cost_of_the_shared_intermediate(
    shared_cost: float, expected: set[str], total: float, ilp: bool
) -> None:
    cost = _costs({"A": shared_cost, "B": 1.0, "C": 1.0, "B2": 7.0, "C2": 7.0, "D": 1.0})
    result = extract(SHARED, [4], cost, SHARED_ORIGINAL, ilp_max_nodes=100 if ilp else 0)
    assert _ops(result.choice) == expected | {"Input", "D"}
    assert result.cost == pytest.approx(total)
    assert check_extraction(result.choice, [4]) is None
    assert result.ilp_status == ("Optimal" if ilp else "not run")


@pytest.mark.parametrize("ilp", [False, True], ids=["local-search", "ilp"])
def test_cycles_are_never_chosen(ilp: bool) -> None:
    result = extract(CYCLIC, [3], CYCLIC_COSTS, CYCLIC_ORIGINAL, ilp_max_nodes=100 if ilp else 0)
    assert check_extraction(result.choice, [3]) is None
    assert "Self" not in _ops(result.choice)
    assert len(_ops(result.choice) & {"Y", "W"}) == 1  # one of them breaks the cycle
    assert result.cost == pytest.approx(6.0)


def test_readers_inlined_together_never_close_a_cycle() -> None:
    # Readers 2 and 3 of the costly class 1 can each read the other instead, at no saving alone;
    # dropping class 1 needs both to switch, which closes the cycle 2 -> 3 -> 2. The inlining
    # move checks each reader against the numbering from before the move; reader 2 goes first
    # and then reads 3, numbered after it, so only the move's final renumbering sees the cycle.
    data = EGraphData(
        classes={
            0: [LEAF],
            1: [_node("S", 0)],
            2: [_node("A", 1), _node("A2", 3)],
            3: [_node("B", 1), _node("B2", 2)],
            4: [_node("R", 3, 2)],
        }
    )
    original = [
        (0, LEAF),
        (1, _node("S", 0)),
        (2, _node("A", 1)),
        (3, _node("B", 1)),
        (4, _node("R", 3, 2)),
    ]
    cost = _costs({"S": 10.0, "A": 1.0, "A2": 1.0, "B": 1.0, "B2": 1.0, "R": 1.0})
    result = extract(data, [4], cost, original, ilp_max_nodes=0)
    assert check_extraction(result.choice, [4]) is None
    assert result.cost == pytest.approx(13.0)


def test_a_cheaper_cycle_is_refused_when_starting_from_the_original_program() -> None:
    # The original program reads class 2 from class 1 (V) though the bottom-up order puts 1
    # first; its numbering once gave both the same position, which hid the cycle that U2 would
    # close (1 reads 2, 2 reads 1) and made extraction fail its own check (BLOOM attention).
    data = EGraphData(
        classes={
            0: [LEAF],
            1: [_node("V", 2), _node("V0", 0)],
            2: [_node("U", 0), _node("U2", 1)],
            3: [_node("R", 1, 2)],
        }
    )
    original = [(0, LEAF), (2, _node("U", 0)), (1, _node("V", 2)), (3, _node("R", 1, 2))]
    cost = _costs({"V": 1.0, "V0": 10.0, "U": 5.0, "U2": 0.0, "R": 1.0})
    result = extract(data, [3], cost, original, ilp_max_nodes=0)
    assert check_extraction(result.choice, [3]) is None
    assert result.cost == pytest.approx(7.0)


def test_ilp_result_is_a_valid_optimal_program() -> None:
    start = dict(CYCLIC_ORIGINAL)
    assert dag_cost(start, [3], CYCLIC_COSTS) == pytest.approx(11.0)
    ilp = solve_ilp(CYCLIC, [3], CYCLIC_COSTS, start, 5.0)
    assert ilp.status == "Optimal"
    assert ilp.choice is not None
    assert check_extraction(ilp.choice, [3]) is None
    assert ilp.cost == pytest.approx(6.0)


def test_intermediate_is_dropped_when_its_readers_do_better_without_it() -> None:
    # A third, never-needed reader E makes the greedy pass charge each reader a third of A,
    # so it first shares A (12 + 1 + 1 + 1); dropping A for B2 and C2 costs 5.9 + 5.9 + 1.
    data = EGraphData(classes={**SHARED.classes, 5: [_node("E", 1)], 6: [_node("F", 5)]})
    cost = _costs({"A": 12.0, "B": 1.0, "C": 1.0, "B2": 5.9, "C2": 5.9, "D": 1.0})
    result = extract(data, [4], cost, SHARED_ORIGINAL, ilp_max_nodes=0)
    assert _ops(result.choice) == {"Input", "B2", "C2", "D"}
    assert result.cost == pytest.approx(12.8)


# Classes 1 to 3 are computed from the leaf each (Q, K, V) or as slices of class 6, a merged op
# that computes all three at once (Merged), or by way of class 4 (Via), which has other
# readers, so the greedy pass prices it at a third of its cost and picks it for class 6. The
# output also reads the leaf (a residual), so no move that drops the leaf can help.
MERGED = EGraphData(
    classes={
        0: [LEAF],
        1: [_node("Q", 0), _node("Slice", 6)],
        2: [_node("K", 0), _node("Slice", 6)],
        3: [_node("V", 0), _node("Slice", 6)],
        4: [_node("Big", 0)],
        5: [_node("Use", 1, 2, 3, 0)],
        6: [_node("Merged", 0), _node("Via", 4)],
        7: [_node("Other", 4)],
        8: [_node("Other", 4)],
    }
)
MERGED_ORIGINAL = [
    (0, LEAF),
    (1, _node("Q", 0)),
    (2, _node("K", 0)),
    (3, _node("V", 0)),
    (5, _node("Use", 1, 2, 3, 0)),
]


@pytest.mark.parametrize("ilp", [False, True], ids=["local-search", "ilp"])
def test_readers_move_onto_a_merged_op_together(ilp: bool) -> None:
    # Moving one reader at a time onto the merged op costs more (5 for 4 saved), so only a
    # move of all three finds it; the merged op then takes its best node, not Via (13).
    cost = _costs({"Q": 4.0, "K": 4.0, "V": 4.0, "Merged": 5.0, "Big": 13.0, "Use": 1.0})
    result = extract(MERGED, [5], cost, MERGED_ORIGINAL, ilp_max_nodes=1000 if ilp else 0)
    assert _ops(result.choice) == {"Input", "Slice", "Merged", "Use"}
    assert result.cost == pytest.approx(6.0)


def test_check_extraction_names_a_cycle() -> None:
    choice = {0: LEAF, 1: _node("X", 2), 2: _node("Z", 1), 3: _node("R", 1, 2)}
    error = check_extraction(choice, [3])
    assert error is not None and "cycle" in error


def test_check_extraction_names_a_class_without_a_node() -> None:
    error = check_extraction({3: _node("R", 1, 2), 1: _node("Y", 0), 0: LEAF}, [3])
    assert error == "class 2 is needed but has no node"


def test_output_class_that_only_reads_itself_is_an_error() -> None:
    data = EGraphData(classes={0: [LEAF], 1: [_node("Loop", 1)]})
    with pytest.raises(OptimizeError, match="no program for output classes"):
        extract(data, [1], _costs({}), [(0, LEAF)], ilp_max_nodes=0)
