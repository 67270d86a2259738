"""The memory budget: where it comes from and what it refuses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from knopt.errors import MemoryLimitError, UnsupportedModelError
from knopt.ir import DType, GraphBuilder
from knopt.ir.memory import (
    ENVIRONMENT_VARIABLE,
    MAX_RANK,
    check_bytes,
    check_shape,
    format_bytes,
    memory_limit,
    parse_size,
    set_memory_limit,
)


@pytest.fixture(autouse=True)
def default_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    yield
    set_memory_limit(None)


@pytest.mark.parametrize(
    ("text", "size"),
    [("123", 123), ("2K", 2048), ("512M", 512 * 2**20), ("1.5G", 3 * 2**29), ("1TiB", 2**40)],
)
def test_sizes_are_read_with_binary_suffixes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-5", "1Q", "G"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_the_default_is_a_part_of_the_machines_memory() -> None:
    assert 64 * 2**20 <= memory_limit() < 2**50


def test_the_environment_variable_sets_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "3M")
    assert memory_limit() == 3 * 2**20
    with pytest.raises(MemoryLimitError, match=f"set by {ENVIRONMENT_VARIABLE}"):
        check_bytes(4 * 2**20, "a tensor")


def test_a_bad_environment_variable_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "plenty")
    with pytest.raises(MemoryLimitError, match=f"{ENVIRONMENT_VARIABLE}: 'plenty'"):
        memory_limit()


def test_the_library_setting_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "3M")
    set_memory_limit("1K")
    assert memory_limit() == 1024
    set_memory_limit(None)
    assert memory_limit() == 3 * 2**20


def test_a_limit_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="not positive"):
        set_memory_limit(0)


def test_a_shape_over_the_limit_is_named_with_its_size() -> None:
    set_memory_limit("1M")
    check_shape([512, 512], 4, "fits")
    expected = r"node 'big' of shape \[1024, 512\]: needs 2\.0 MiB"
    with pytest.raises(MemoryLimitError, match=expected):
        check_shape([1024, 512], 4, "node 'big'")


def test_an_empty_shape_no_array_can_index_is_refused() -> None:
    with pytest.raises(MemoryLimitError, match="more than any array can index"):
        check_shape([2**32, 2**32, 0], 4, "x")
    check_shape([2**20, 2**20, 0], 4, "x")  # empty, and numpy can represent it


def test_a_shape_of_more_axes_than_numpy_iterates_is_refused() -> None:
    check_shape([1] * MAX_RANK, 4, "x")
    with pytest.raises(UnsupportedModelError, match=r"node 'deep': 33 axes, more than the 32"):
        check_shape([1] * (MAX_RANK + 1), 4, "node 'deep'")


def test_the_builder_refuses_a_value_over_the_limit_naming_its_node() -> None:
    set_memory_limit("1M")
    b = GraphBuilder("big")
    x = b.input("x", (1, 512), DType.F32)
    b.current_name = "grow"
    with pytest.raises(MemoryLimitError, match=r"node 'grow' \(Broadcast\)"):
        b.broadcast(x, (1024, 512))


def test_bytes_read_like_people_write_them() -> None:
    assert format_bytes(12) == "12 B"
    assert format_bytes(3 * 2**29) == "1.5 GiB"
    assert format_bytes(7 * 2**40) == "7.0 TiB"
