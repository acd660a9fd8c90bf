"""Text from data made visible: control characters shown as escapes, never sent raw to a terminal or a label.

Any string a collector wrote (a Falco ``hostname``, a Slurm account, a user
name) may hold ESC sequences that retitle or clear a terminal, or a C1 control
that some terminals obey too. ``visible`` rewrites every C0 control (tab and
newline included: one value, one line), DEL and every C1 control as ``\\xNN``, and
every bidirectional formatting character as ``\\uNNNN``, so the text is shown literally,
stays on one line and in the order it was written. The CLI adds Rich's markup
escape on top (cli/common.py ``safe_text``); the exporter uses this for label values.
"""

from __future__ import annotations

import re

__all__ = ["visible", "CONTROL_CHARACTERS"]

#: C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F): ECMA-48 §5 / ISO 6429 control functions; and
#: the bidirectional formatting characters of Unicode's UAX #9 (ALM U+061C, LRM/RLM U+200E-U+200F, the
#: embeddings and overrides U+202A-U+202E, the isolates U+2066-U+2069): a right-to-left override in a
#: host or user name reverses the text after it on the terminal, so a table cell can show what it is not
#: (CVE-2021-42574, "Trojan Source", is the same trick in source code).
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: object) -> str:
    """``text`` as a string with each control character written as ``\\xNN`` (ESC becomes ``\\x1b``) and
    each bidirectional formatting character as ``\\uNNNN`` (the right-to-left override becomes ``\\u202e``)."""
    return CONTROL_CHARACTERS.sub(_escape, text if isinstance(text, str) else str(text))
