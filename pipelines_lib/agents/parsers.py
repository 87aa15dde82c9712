"""Tool-call parsers: model text -> ``ParseResult(tool_calls, text, errors)``, one parser per model family.

A parser has two halves. The format half (one class per family, registered in ``PARSER_REGISTRY``) finds the
call sites in the response and turns each into ``(name, arguments)`` or a format error. The shared
``check_call`` half validates every extracted call against the offered tools: the name must be one of them,
the arguments a JSON object no larger than ``max_argument_chars`` and no deeper than ``max_argument_depth``,
with the schema's required properties present and top-level JSON types matching. Nothing raises: every problem
becomes a ``ToolCallError`` that the agent turns into a tool message the model sees, so a malformed call is
a learning signal rather than a crash.

Work is bounded by ``ParserLimits``, whatever the model writes: only the first ``max_scan_chars`` characters are
searched, at most ``max_calls`` call sites are read (one error says there were more), the format halves find
sites with linear scans (``str.find``, never a backtracking regex), and a JSON integer longer than
``MAX_INT_DIGITS`` is a ``bad_json`` error (Python refuses to convert it). So a response is parsed in time
linear in ``max_scan_chars`` and produces at most ``max_calls + 2`` tool messages.

Formats:
- ``hermes`` (alias ``qwen``; the format our chat template teaches): ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``, any number, anywhere in the text.
- ``llama3``: the Llama 3.1 JSON form, the whole response being ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``; several calls may be separated by ``;`` or newlines.
- ``gemma``: Gemma's Python-call forms (parsed with ``ast``, never evaluated; keyword arguments, literal values):
  primarily a fenced block ``` ```tool_code\\nname(arg=1, b="x")\\n``` ``` with one call per line (``print(...)``
  around a call is accepted), and also a whole response ``[name(arg=1), other(b="x")]``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}

ERROR_KINDS = ("bad_format", "bad_json", "unknown_tool", "bad_arguments", "too_large", "too_deep")

MAX_INT_DIGITS = 4300
"""Longest integer literal read from a call (Python's default int-to-str limit, ``sys.get_int_max_str_digits``)."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ToolCallError:
    """One call the model attempted but got wrong; ``message`` is written for the model to read."""

    kind: str
    message: str
    name: str | None = None
    """The tool name when it could be read, so the error message can be attributed to the call."""
    raw: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"ToolCallError.kind must be one of {ERROR_KINDS}, got {self.kind!r}")


@dataclass(frozen=True, kw_only=True)
class ParseResult:
    tool_calls: list[ToolCall] = field(default_factory=list)
    text: str = ""
    """The response with the call sites removed (the answer, or the reasoning around the calls)."""
    errors: list[ToolCallError] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        """True when the model tried to call a tool, successfully or not."""
        return bool(self.tool_calls or self.errors)


@dataclass(frozen=True, kw_only=True)
class ParserLimits:
    max_argument_chars: int = 4096
    """Serialized size above which arguments are refused (a runaway generation, not a real call)."""
    max_argument_depth: int = 4
    """Nesting depth of the arguments object above which it is refused."""
    max_calls: int = 8
    """Call sites read per response; a response with more gets one error saying so (the rest are not read)."""
    max_scan_chars: int = 65_536
    """Characters of a response searched for calls; a longer response gets one error and its tail is not read."""

    def __post_init__(self) -> None:
        for name in ("max_argument_chars", "max_argument_depth", "max_calls", "max_scan_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"ParserLimits.{name} must be >= 1, got {getattr(self, name)}")


ToolSchemas = Mapping[str, Mapping[str, Any]]
"""Tool name -> its JSON-schema ``parameters`` object."""

# What a format half returns per call site: (name, arguments) or an error, in text order.
RawCall = tuple[str, Any] | ToolCallError


@dataclass(kw_only=True)
class _Sites:
    """What a format half found: call sites (at most ``max_calls``), their raw text, and the text around them."""

    calls: list[RawCall] = field(default_factory=list)
    raws: list[str] = field(default_factory=list)
    text: str = ""
    more: bool = False
    """The response holds more call sites than ``max_calls`` (not read)."""

    def add(self, call: RawCall, raw: str) -> None:
        self.calls.append(call)
        self.raws.append(raw)


class ToolCallParser(Protocol):
    def parse(self, text: str, tools: ToolSchemas, limits: ParserLimits = ...) -> ParseResult: ...


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels; iterative, so hostile nesting cannot overflow."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth + 1 > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        types = JSON_TYPES.get(name)
        if types is None:  # a schema type we do not check (e.g. a $ref) accepts anything
            return True
        # bool is an int in Python but not an integer/number in JSON.
        if isinstance(value, types) and not (isinstance(value, bool) and name in ("integer", "number")):
            return True
    return False


def check_call(name: Any, arguments: Any, tools: ToolSchemas, limits: ParserLimits, raw: str) -> ToolCall | ToolCallError:
    """Validate one extracted call against the offered tools (see the module docstring)."""
    if not isinstance(name, str) or not name:
        return ToolCallError(kind="bad_format", message="tool call has no string \"name\"", raw=raw)
    if name not in tools:
        offered = ", ".join(sorted(tools)) or "none"
        return ToolCallError(kind="unknown_tool", name=name, raw=raw,
                             message=f"unknown tool {name!r}; available tools: {offered}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallError(kind="bad_arguments", name=name, raw=raw,
                             message=f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    size = len(json.dumps(arguments, ensure_ascii=False, default=str))
    if size > limits.max_argument_chars:
        return ToolCallError(kind="too_large", name=name, raw=raw[:200],
                             message=f"arguments of {name} are {size} characters (limit {limits.max_argument_chars})")
    if _deeper_than(arguments, limits.max_argument_depth):
        return ToolCallError(kind="too_deep", name=name, raw=raw[:200],
                             message=f"arguments of {name} nest deeper than {limits.max_argument_depth} levels")
    schema = tools[name]
    properties: Mapping[str, Any] = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        return ToolCallError(kind="bad_arguments", name=name, raw=raw,
                             message=f"{name} is missing required argument(s): {', '.join(missing)}")
    for key, value in arguments.items():
        if key not in properties:
            if schema.get("additionalProperties", True) is False:
                return ToolCallError(kind="bad_arguments", name=name, raw=raw,
                                     message=f"{name} has no argument {key!r}; it takes: {', '.join(properties)}")
            continue
        expected = properties[key].get("type")
        if expected is not None and not _type_ok(value, expected):
            return ToolCallError(kind="bad_arguments", name=name, raw=raw,
                                 message=f"argument {key!r} of {name} must be of type {expected}, got {type(value).__name__}")
    return ToolCall(name=name, arguments=arguments)


def _parse(find: Callable[[str, ToolSchemas, ParserLimits], _Sites], text: str, tools: ToolSchemas,
           limits: ParserLimits) -> ParseResult:
    """Run a format half on the scanned part of ``text`` and check what it found (the shared half)."""
    scanned = text[: limits.max_scan_chars]
    sites = find(scanned, tools, limits)
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for item, raw in zip(sites.calls, sites.raws, strict=True):
        checked = item if isinstance(item, ToolCallError) else check_call(item[0], item[1], tools, limits, raw)
        (errors if isinstance(checked, ToolCallError) else calls).append(checked)
    if sites.more:
        errors.append(ToolCallError(kind="bad_format", message=f"more than {limits.max_calls} tool calls in one "
                                                              f"response; only the first {limits.max_calls} were read"))
    if len(text) > limits.max_scan_chars:
        errors.append(ToolCallError(kind="too_large", message=f"response is {len(text)} characters; only the first "
                                                              f"{limits.max_scan_chars} were searched for tool calls"))
    return ParseResult(tool_calls=calls, text=(sites.text + text[limits.max_scan_chars:]).strip(), errors=errors)


def _blocks(text: str, open_: str, close: str, max_sites: int) -> tuple[list[str], str, str | None, bool]:
    """``open_ ... close`` blocks of ``text`` in one left-to-right pass: (their bodies, at most ``max_sites``;
    the text outside them; an unclosed tail starting at ``open_`` or None; whether more blocks follow)."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(open_, pos)) >= 0:
        outside.append(text[pos:start])
        end = text.find(close, start + len(open_))
        if end < 0:
            return bodies, "".join(outside), text[start:], False
        if len(bodies) == max_sites:
            return bodies, "".join(outside), None, True
        bodies.append(text[start + len(open_):end])
        pos = end + len(close)
    outside.append(text[pos:])
    return bodies, "".join(outside), None, False


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


_JSON = json.JSONDecoder(parse_int=_parse_int)


def _why(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError | SyntaxError):
        return e.msg
    return "nested too deeply" if isinstance(e, RecursionError | MemoryError) else str(e)


def _json_call(payload: str, args_key: str) -> tuple[str, Any] | ToolCallError:
    try:
        obj = _JSON.decode(payload)
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, or an over-long integer
        return ToolCallError(kind="bad_json", raw=payload[:200], message=f"tool call is not valid JSON ({_why(e)})")
    if not isinstance(obj, dict):
        return ToolCallError(kind="bad_format", raw=payload[:200], message="tool call must be a JSON object")
    return obj.get("name"), obj.get(args_key)


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5/3, our chat template)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, text: str, tools: ToolSchemas, limits: ParserLimits = ParserLimits()) -> ParseResult:
        return _parse(self._sites, text, tools, limits)

    def _sites(self, text: str, tools: ToolSchemas, limits: ParserLimits) -> _Sites:
        bodies, outside, unclosed, more = _blocks(text, self.OPEN, self.CLOSE, limits.max_calls)
        sites = _Sites(text=outside, more=more)
        for body in bodies:
            sites.add(_json_call(body.strip(), "arguments"), body)
        if unclosed is not None:  # an opened call never closed: usually a truncated or runaway generation
            error = ToolCallError(kind="bad_format", raw=unclosed[:200],
                                  message=f"{self.OPEN} without a matching {self.CLOSE}")
            if len(sites.calls) < limits.max_calls:
                sites.add(error, unclosed)
            else:
                sites.more = True
        return sites


class Llama3Parser:
    """Llama 3.1 JSON tool calls: ``[<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]``.

    Only a response that *starts* with the tag or ``{`` is a call (Llama's template asks for the call to be the
    whole reply); anything else is plain text.
    """

    TAG = "<|python_tag|>"

    def parse(self, text: str, tools: ToolSchemas, limits: ParserLimits = ParserLimits()) -> ParseResult:
        return _parse(self._sites, text, tools, limits)

    def _sites(self, text: str, tools: ToolSchemas, limits: ParserLimits) -> _Sites:
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):].strip()
        elif not body.startswith("{"):
            return _Sites(text=text)
        sites = _Sites()
        pos = 0
        while pos < len(body):
            if len(sites.calls) == limits.max_calls:
                sites.more = True
                break
            try:
                obj, end = _JSON.raw_decode(body, pos)
            except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, or an over-long integer
                sites.add(ToolCallError(kind="bad_json", raw=body[pos:pos + 200],
                                        message=f"tool call is not valid JSON ({_why(e)})"), body[pos:])
                break
            if isinstance(obj, dict):
                # Llama 3.1 documents "parameters"; accept "arguments" too, as some fine-tunes emit it.
                sites.add((obj.get("name"), obj.get("parameters", obj.get("arguments"))), body[pos:end])
            else:
                sites.add(ToolCallError(kind="bad_format", raw=body[pos:end][:200],
                                        message="tool call must be a JSON object"), body[pos:end])
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return sites


class GemmaParser:
    """Gemma's Python-call forms, parsed with ``ast`` and never evaluated; keyword arguments, literal values.

    - a fenced block ```` ```tool_code\nname(a=1)\n``` ````, one call per line, optionally wrapped in
      ``print(...)`` as Google's cookbook writes it (the form our tests pin as the primary one);
    - a whole response that is a list of calls, ``[name(a=1), other(b="x")]`` (Gemma 3's function-calling
      prompt format). A bracketed response that is not entirely calls is plain text (``[1, 2]`` is an answer).
    """

    OPEN, CLOSE = "```tool_code", "```"

    @staticmethod
    def _call(node: ast.expr, raw: str) -> tuple[str, Any] | ToolCallError:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
                and len(node.args) == 1 and not node.keywords):
            node = node.args[0]
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return ToolCallError(kind="bad_format", raw=raw[:200], message="expected a call like name(arg=value)")
        name = node.func.id
        if node.args:
            return ToolCallError(kind="bad_arguments", name=name, raw=raw[:200],
                                 message=f"{name}: pass arguments by keyword, e.g. {name}(x=1)")
        arguments: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return ToolCallError(kind="bad_arguments", name=name, raw=raw[:200], message=f"{name}: no **kwargs")
            try:
                arguments[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return ToolCallError(kind="bad_arguments", name=name, raw=raw[:200],
                                     message=f"{name}: argument {kw.arg!r} must be a literal value")
        return name, arguments

    @staticmethod
    def _expr(source: str) -> ast.expr | ToolCallError:
        try:
            return ast.parse(source, mode="eval").body
        except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
            return ToolCallError(kind="bad_format", raw=source[:200], message=f"tool call is not a Python call ({_why(e)})")

    def parse(self, text: str, tools: ToolSchemas, limits: ParserLimits = ParserLimits()) -> ParseResult:
        return _parse(self._sites, text, tools, limits)

    def _sites(self, text: str, tools: ToolSchemas, limits: ParserLimits) -> _Sites:
        stripped = text.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            node = self._expr(stripped)
            if isinstance(node, ast.List) and node.elts and all(isinstance(e, ast.Call) for e in node.elts):
                sites = _Sites(more=len(node.elts) > limits.max_calls)
                for e in node.elts[: limits.max_calls]:
                    raw = ast.get_source_segment(stripped, e) or ""
                    sites.add(self._call(e, raw), raw)
                return sites
        bodies, outside, unclosed, more = _blocks(text, self.OPEN, self.CLOSE, limits.max_calls)
        sites = _Sites(text=outside, more=more)
        for body in bodies:
            fence, *lines = body.split("\n")
            if fence.strip() and len(sites.calls) < limits.max_calls:
                sites.add(ToolCallError(kind="bad_format", raw=body[:200],
                                        message="put each call on its own line after ```tool_code"), body)
            for line in lines:
                if not line.strip():
                    continue
                if len(sites.calls) == limits.max_calls:
                    sites.more = True
                    return sites
                parsed = self._expr(line.strip())
                sites.add(parsed if isinstance(parsed, ToolCallError) else self._call(parsed, line), line)
        if unclosed is not None:
            error = ToolCallError(kind="bad_format", raw=unclosed[:200], message="```tool_code block never closed")
            if len(sites.calls) < limits.max_calls:
                sites.add(error, unclosed)
            else:
                sites.more = True
        return sites


PARSER_REGISTRY: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "llama3": Llama3Parser,
    "gemma": GemmaParser,
}


def make_parser(name: str) -> ToolCallParser:
    if name not in PARSER_REGISTRY:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSER_REGISTRY)}")
    return PARSER_REGISTRY[name]()
