"""The line a TOML key is written on, and values checked against their field's annotation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import pytest

from hpcwatch.errors import ConfigError
from hpcwatch.tomlkeys import KeyLines, typed

TEXT = """\
top = 1
[notify]
digest = "daily"
[notify.users]
alice = "a@example.org"
[[notify.channel]]
type = "smtp"
[[notify.channel]]
type = "webhook"
url = "https://hooks.example.org"
"""


def test_a_key_is_found_in_the_nth_table_of_an_array():
    lines = KeyLines(TEXT)
    assert lines.find(None, None, "top") == 1
    assert lines.find("notify", None, "digest") == 3
    assert lines.find("notify.channel", 0, "type") == 7
    assert lines.find("notify.channel", 1, "type") == 9
    assert lines.find("notify.channel", 1, "url") == 10


def test_a_key_written_as_a_sub_table_points_at_its_header_and_an_unseen_key_at_its_table():
    lines = KeyLines(TEXT)
    assert lines.find("notify", None, "users") == 4
    assert lines.find(None, None, "notify") == 2
    assert lines.find("notify.channel", 1, "absent") == 8
    assert lines.find("nowhere", None, "absent") == 1


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [(3, float, 3.0), (["a", "b"], tuple[str, ...], ("a", "b")), ("x", Literal["x", "y"], "x"), (True, bool, True)],
)
def test_values_are_taken_as_their_field_takes_them(value, kind, expected):
    assert typed(value, "k", kind, "f:1") == expected


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        (True, int, "f:1: k must be int, got True in [t]"),
        ("z", Literal["x", "y"], "f:1: k must be one of 'x', 'y', got 'z'"),
        ([1], tuple[str, ...], "f:1: k must be a list of strings, got [1]"),
        ({"a": 1}, Mapping[str, str], "f:1: k.a must be a string, got 1"),
    ],
)
def test_a_wrong_value_names_the_file_line_and_key(value, kind, message):
    with pytest.raises(ConfigError) as err:
        typed(value, "k", kind, "f:1", table="t")
    assert str(err.value) == message
