"""A trajectory as the viewer shows it: each recorded turn decoded to text, with its tool calls and results set apart.

``transcript(row, tokenizer)`` takes one shard row (``trajectory.schema``: ``tokens``, ``loss_mask``,
``policy_version`` and the ``turns`` segments) and returns one dict per turn: role, tool name, latency, error,
the token range, the policy versions of the turn's generated tokens, how a generated turn ended, and the turn's
text cut into ``parts``. A part is ``[kind, text]`` with kind ``text``, ``markup`` (what the chat template writes
around messages: the tokenizer's special tokens, the role name and whitespace of a turn header), ``tool_call`` (an
assistant's ``<tool_call>…</tool_call>``) or ``tool_result`` (a ``<tool_response>…</tool_response>``).

Markup is told by token id, not by text: a tool result or a model that prints ``<|im_end|>`` gets plain-text ids
(``ChatTokenizer.render_ids``), and it stays text here, inside its tool result, as the model saw it.

A row is decoded only by the tokenizer its ids belong to: ``tokenizer_hash`` is recorded per trajectory, and a
trajectory whose hash differs from the tokenizer's (or with no tokenizer at all) keeps its turns without text,
so the page shows ids rather than the wrong words.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipelines_lib.model.tokenizer import MARKUP_TOKENS, ChatTokenizer
from pipelines_lib.trajectory.schema import ROLES

TOOL_CALL, TOOL_RESULT = MARKUP_TOKENS[:2], MARKUP_TOKENS[2:]
"""``(open, close)`` of a tool call and of a tool result, as the chat template writes them."""
TOOL_SPANS = re.compile(
    "|".join(f"({re.escape(a)}.*?(?:{re.escape(b)}|$))" for a, b in (TOOL_CALL, TOOL_RESULT)), re.DOTALL
)
"""A tool call, or a tool result; one missing its closing tag (cut short, or malformed) runs to the end of its text."""
HEADER_REST = re.compile(f"(?:{'|'.join(ROLES)})?\\s*")
"""What follows a special token in a turn header: the role name (``<|im_start|>tool\\n``) and whitespace."""


def text_parts(text: str) -> list[list[str]]:
    """``text`` (no special tokens in it) as ``text``, ``tool_call`` and ``tool_result`` parts, in order."""
    out: list[list[str]] = []
    at = 0
    for m in TOOL_SPANS.finditer(text):
        if m.start() > at:
            out.append(["text", text[at : m.start()]])
        out.append(["tool_call" if m.lastindex == 1 else "tool_result", m.group()])
        at = m.end()
    if at < len(text):
        out.append(["text", text[at:]])
    return out


def turn_parts(ids: Sequence[int], tokenizer: ChatTokenizer) -> list[list[str]]:
    """The turn ``ids`` as ``[kind, text]`` parts (see the module docstring); joined, they are its decoded text."""
    special = set(tokenizer.hf.all_special_ids)
    out: list[list[str]] = []
    for is_special, run in itertools.groupby(ids, key=lambda i: i in special):
        text = tokenizer.decode(list(run))
        if is_special:
            out.append(["markup", text])
            continue
        if out:  # after a special token: the rest of a turn header
            head = HEADER_REST.match(text).group()
            if head:
                out.append(["markup", head])
                text = text[len(head) :]
        out += text_parts(text)
    # Whitespace beside markup is the template's separator; runs of markup read as one.
    merged: list[list[str]] = []
    for k, (kind, s) in enumerate(out):
        beside = any(0 <= j < len(out) and out[j][0] == "markup" for j in (k - 1, k + 1))
        kind = "markup" if kind == "text" and not s.strip() and beside else kind
        if merged and kind == "markup" == merged[-1][0]:
            merged[-1][1] += s
        else:
            merged.append([kind, s])
    return merged


def _versions(row: Mapping[str, Any], start: int, end: int) -> list[int]:
    """Policy versions of the generated tokens in ``[start, end)``: ``[oldest, newest]``, or [] if none."""
    got = [v for m, v in zip(row["loss_mask"][start:end], row["policy_version"][start:end], strict=True) if m]
    return [min(got), max(got)] if got else []


def _ended(row: Mapping[str, Any], turn: Mapping[str, Any], stop_ids: Sequence[int]) -> str | None:
    """How a generated turn ended: ``stop`` (its last id is a stop id) or ``cut`` (a length limit); None for
    turns the model did not write."""
    if turn["role"] != "assistant" or turn["end"] <= turn["start"]:
        return None
    return "stop" if row["tokens"][turn["end"] - 1] in stop_ids else "cut"


def decodes(row: Mapping[str, Any], tokenizer: ChatTokenizer | None) -> bool:
    """Whether ``tokenizer`` is the one the row's ids belong to: its hash, and every id one of its ids (a shard
    holding others, -5 say, is damaged: its turns keep their ids)."""
    return (tokenizer is not None and row["tokenizer_hash"] == tokenizer.tokenizer_hash
            and all(0 <= i < tokenizer.vocab_size for i in row["tokens"]))


def transcript(row: Mapping[str, Any], tokenizer: ChatTokenizer | None) -> list[dict[str, Any]]:
    """The row's turns (a row without recorded turns is one ``sequence`` turn), decoded when ``decodes``."""
    n = len(row["tokens"])
    turns = row["turns"] or [{"role": "sequence", "start": 0, "end": n}]
    decoded = decodes(row, tokenizer)
    stop_ids = tokenizer.stop_ids if tokenizer is not None else ()
    out = []
    for t in turns:
        start, end = max(0, t["start"]), min(n, t["end"])
        turn = {
            "role": t["role"],
            "tool_name": t.get("tool_name"),
            "latency_s": t.get("latency_s"),
            "error": t.get("error"),
            "start": start,
            "end": end,
            "versions": _versions(row, start, end),
            "ended": _ended(row, {**t, "start": start, "end": end}, stop_ids) if decoded else None,
            "parts": None,
        }
        if decoded:
            turn["parts"] = turn_parts(row["tokens"][start:end], tokenizer)
        out.append(turn)
    return out


def prompt_text(turns: Sequence[Mapping[str, Any]], prompt_len: int) -> str:
    """What the task asked: the plain text of the last decoded turn inside the prompt (its user message), or ""."""
    for t in reversed([t for t in turns if t["end"] <= prompt_len and t["parts"]]):
        text = "".join(s for kind, s in t["parts"] if kind == "text").strip()
        if text:
            return text
    return ""


def vocabulary(tokenizer: ChatTokenizer, ids: Iterable[int]) -> dict[int, str]:
    """Each id's own text (``decode([id])``: a byte-level piece of a multi-byte character shows as U+FFFD); an id
    that is none of the tokenizer's has none (the page shows the number)."""
    return {i: tokenizer.decode([i]) for i in sorted(set(ids)) if 0 <= i < tokenizer.vocab_size}
