"""Text for a terminal: ``printable`` escapes the control characters of whatever a campaign holds.

A campaign's content (a folder's name, a trajectory id, a tool's output) is data someone else wrote; printed raw,
an escape sequence in it would be a command to the reader's terminal. Every line the library prints from a campaign
goes through ``printable``: the command line's ``say`` and ``to_stderr`` (``pipelines_lib.cli``) and the stop
messages a signal prints (``stages.stopping``), which cannot import the command line (it runs stages that stop).
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline: C0, DEL and C1 (``\\x1b`` starts a terminal's commands)."""


def printable(text: str) -> str:
    """``text`` with each control character but tab and newline written as its escape (``\\x1b``): whatever a
    campaign holds reaches the terminal as text, never as a command to it."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


__all__ = ["printable"]
