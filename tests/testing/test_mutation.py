"""Mutants of the fixture models (and of tests/hostile/corpus.py): knopt gives a result or a
knopt error, never anything else.

Each mutant (`knopt.testing.mutation`) is loaded, run on random inputs, optimized under small
limits and run again, in a worker process (`knopt.testing.trial`) with a memory budget of
256 MiB. Any exception that is not a `KnoptError`, a trial over 10 s, a dead worker or a worker
over 2 GiB of memory fails the test. `KNOPT_MUTANTS=N` tries N mutants (CI: the default),
`KNOPT_MUTANT_SEED` picks the run, `KNOPT_MUTANT_OPTIMIZE_EVERY=N` optimizes every N-th only,
and `KNOPT_MUTANT_DIR` keeps the failing mutants. See tests/testing/NOTES.md.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from knopt.testing.mutation import FIELD_MUTATIONS, Mutation, make_mutant
from knopt.testing.trial import CRASH, FAILED, HANG, OK, REFUSED, Trials, run_campaign
from tests.hostile.corpus import corpus
from tests.models import fixtures

MUTANTS = int(os.environ.get("KNOPT_MUTANTS", "300"))
SEED = int(os.environ.get("KNOPT_MUTANT_SEED", "0"))
OPTIMIZE_EVERY = int(os.environ.get("KNOPT_MUTANT_OPTIMIZE_EVERY", "1"))
PEAK_LIMIT = 2 * 2**30
# The fixtures, and small models of what they lack (functions, If, Loop, Scan).
MODELS = [(f.file, f.path.read_bytes()) for f in fixtures()] + corpus()
MLP = next(data for name, data in MODELS if name == "mlp_ts14.onnx")


@pytest.fixture(scope="module")
def trials() -> Iterator[Trials]:
    with Trials() as worker:
        yield worker


def test_a_mutant_is_made_again_from_its_seed_and_index() -> None:
    first, again = make_mutant(MODELS, 7, 11), make_mutant(MODELS, 7, 11)
    assert (first.source, first.changes, first.data) == (again.source, again.changes, again.data)
    assert make_mutant(MODELS, 7, 12).data != first.data


def _name(mutation: Mutation) -> str:
    return str(getattr(mutation, "__name__", mutation))


MUTATIONS: list[Mutation] = sorted(dict.fromkeys(FIELD_MUTATIONS), key=_name)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=_name)
def test_each_field_mutation_changes_some_fixture(mutation: Mutation) -> None:
    rng = random.Random(3)
    for _, data in MODELS:
        model = onnx.ModelProto()
        model.ParseFromString(data)
        for _ in range(10):  # a draw may find nothing to change (an attribute of a graph type)
            if mutation(rng, model) is not None:
                assert model.SerializeToString() != data
                return
    pytest.fail(f"{mutation.__name__} changed no fixture")


def _with_undecodable_names(data: bytes) -> onnx.ModelProto:
    """The MLP with its input's name made invalid UTF-8, as an earlier byte change leaves it
    (protobuf then reads that name back as bytes, not str)."""
    model = onnx.ModelProto()
    model.ParseFromString(data)
    name = model.graph.input[0].name.encode()
    model.ParseFromString(data.replace(name, b"\xff" * len(name)))
    assert any(isinstance(n, bytes) for node in model.graph.node for n in node.input)
    return model


@pytest.mark.parametrize("mutation", MUTATIONS, ids=_name)
def test_field_mutations_take_names_that_are_not_utf8(mutation: Mutation) -> None:
    rng = random.Random(5)
    model = _with_undecodable_names(MLP)
    for _ in range(20):
        mutation(rng, model)  # raises nothing: a campaign stops at a fuzzer's own error


def test_trials_tell_results_from_knopt_errors_from_bugs(trials: Trials) -> None:
    assert trials.run(MLP, optimize=True).status == OK
    refused = trials.run(b"not a model", optimize=False)
    assert refused.status == REFUSED
    assert refused.detail.startswith("InvalidModelError: ")


def test_a_trial_over_its_time_is_a_hang_and_the_worker_starts_again() -> None:
    with Trials(timeout=0.001) as hasty:
        assert hasty.run(MLP, optimize=True).status == HANG
        hasty.timeout = 60.0
        assert hasty.run(MLP, optimize=False).status == OK


def test_a_memory_blow_up_is_a_finding() -> None:
    with Trials(address_space=2**28) as cramped:  # 256 MiB of address space: too little
        outcome = cramped.run(MLP, optimize=True)
    # A MemoryError, or a library that aborts when it cannot allocate (OpenBLAS does).
    assert outcome.status in (FAILED, CRASH)


def test_mutants_of_the_fixtures_fail_only_with_knopt_errors(trials: Trials) -> None:
    campaign = run_campaign(MODELS, SEED, MUTANTS, optimize_every=OPTIMIZE_EVERY, trials=trials)
    print(  # shown with -s: what a long run records in tests/testing/NOTES.md
        f"\n{MUTANTS} mutants, seed {SEED}: {dict(sorted(campaign.counts.items()))}, worker "
        f"peak {campaign.peak_bytes / 2**20:.0f} MiB, slowest {campaign.slowest:.1f} s"
    )
    folder = os.environ.get("KNOPT_MUTANT_DIR")
    lines = []
    for mutant, outcome in campaign.findings:
        name = f"mutant-{mutant.seed}-{mutant.index}.onnx"
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(mutant.data)
        lines.append(f"{name} from {mutant.source} {list(mutant.changes)}: {outcome.status}")
        lines.append(outcome.detail)
    assert not campaign.findings, "\n".join(lines)
    assert campaign.peak_bytes < PEAK_LIMIT, f"a worker peaked at {campaign.peak_bytes} bytes"
    assert campaign.counts.get(OK, 0) > 0  # some mutants still run: the inputs are sound
