"""Size profiles: (min, opt, max) ranges of named sizes, checked against runs."""

from __future__ import annotations

import pytest

from knopt.errors import InputError
from knopt.ir.dims import SizeProfile, SizeRange, parse_range, parse_range_text


def test_a_plain_size_fixes_it_and_a_triple_ranges_it() -> None:
    profile = SizeProfile.parse({"batch": 4, "seq": (1, 128, 512)}, {"batch", "seq", "past"})
    assert profile.fixed == {"batch": 4}
    assert profile.representative == {"batch": 4, "seq": 128}
    profile.check({"batch": 4, "seq": 1, "past": 10_000})
    with pytest.raises(
        InputError, match=r"size 'seq' is 513, outside the session's range 1\.\.512"
    ):
        profile.check({"seq": 513})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seq=1:128:512", ("seq", SizeRange(1, 128, 512))),
        ("batch=2", ("batch", SizeRange(2, 2, 2))),
    ],
)
def test_command_line_ranges(text: str, expected: tuple[str, SizeRange]) -> None:
    assert parse_range_text(text) == expected
    assert str(expected[1]) in text


@pytest.mark.parametrize(
    "text", ["seq", "seq=1:2", "seq=a", "=3", "seq=-1:2:3", "seq=5:2:9", "seq=0"]
)
def test_malformed_command_line_ranges_are_refused(text: str) -> None:
    with pytest.raises(InputError):
        parse_range_text(text)


@pytest.mark.parametrize("spec", [True, (1, 2), (1.0, 2, 3), "8", (3, 2, 1), (-1, 0, 1)])
def test_malformed_ranges_are_refused(spec: object) -> None:
    with pytest.raises(InputError, match="size 'seq'"):
        parse_range("seq", spec)


def test_a_misspelt_size_names_the_model_sizes() -> None:
    with pytest.raises(InputError, match=r"no size 'bacth' \(its sizes: batch, seq\)"):
        SizeProfile.parse({"bacth": 2}, {"seq", "batch"})
    with pytest.raises(InputError, match="none: all its sizes are fixed"):
        SizeProfile.parse({"batch": 2}, set())
