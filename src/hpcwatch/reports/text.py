"""Text from data made visible: control characters shown as escapes, never sent raw to a terminal or a label.

Any string a collector wrote (a Falco ``hostname``, a Slurm account, a user
name) may hold ESC sequences that retitle or clear a terminal, or a C1 control
that some terminals obey too. ``visible`` rewrites every C0 control (tab and
newline included: one value, one line), DEL and every C1 control as ``\\xNN``, so
the text is shown literally and stays on one line. The CLI adds Rich's markup
escape on top (cli/common.py ``safe_text``); the exporter uses this for label values.
"""

from __future__ import annotations

import re

__all__ = ["visible", "CONTROL_CHARACTERS"]

#: C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F): ECMA-48 §5 / ISO 6429 control functions.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def visible(text: object) -> str:
    """``text`` as a string with each control character written as ``\\xNN`` (ESC becomes ``\\x1b``)."""
    return CONTROL_CHARACTERS.sub(_escape, text if isinstance(text, str) else str(text))
