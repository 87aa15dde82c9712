"""Tool-call parsers: goldens per format, every malformed call becomes an error (never an exception), and work is
bounded whatever the model writes (huge integers, floods of calls or tags, long responses)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines_lib.agents.parsers import (
    MAX_INT_DIGITS,
    PARSER_REGISTRY,
    ParserLimits,
    ToolCall,
    make_parser,
)

TOOLS = {
    "calculator": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
    "search": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
        "required": ["query"],
        "additionalProperties": False,
    },
}


def test_hermes_golden_two_calls_and_text() -> None:
    text = (
        'Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"query": "jax", "k": 2}}\n</tool_call>'
    )
    result = make_parser("hermes").parse(text, TOOLS)
    assert result.tool_calls == [
        ToolCall(name="calculator", arguments={"expression": "2+3"}),
        ToolCall(name="search", arguments={"query": "jax", "k": 2}),
    ]
    assert result.text == "Let me compute."
    assert result.errors == []


def test_qwen_is_hermes() -> None:
    assert PARSER_REGISTRY["qwen"] is PARSER_REGISTRY["hermes"]


def test_hermes_plain_answer_has_no_calls() -> None:
    result = make_parser("hermes").parse("<answer>5</answer>", TOOLS)
    assert not result.has_calls
    assert result.text == "<answer>5</answer>"


def test_llama3_golden_with_python_tag_and_two_calls() -> None:
    text = '<|python_tag|>{"name": "calculator", "parameters": {"expression": "7*6"}}; {"name": "search", "parameters": {"query": "x"}}'
    result = make_parser("llama3").parse(text, TOOLS)
    assert result.tool_calls == [
        ToolCall(name="calculator", arguments={"expression": "7*6"}),
        ToolCall(name="search", arguments={"query": "x"}),
    ]
    assert result.errors == []


def test_llama3_bare_json_call_and_plain_text() -> None:
    parser = make_parser("llama3")
    assert parser.parse('{"name": "calculator", "parameters": {"expression": "1"}}', TOOLS).tool_calls == [
        ToolCall(name="calculator", arguments={"expression": "1"})
    ]
    plain = parser.parse("The answer is {42}.", TOOLS)
    assert not plain.has_calls and plain.text == "The answer is {42}."


def test_gemma_golden_tool_code_block() -> None:
    text = 'I will search.\n```tool_code\nsearch(query="flax nnx", k=3)\ncalculator(expression="2**10")\n```'
    result = make_parser("gemma").parse(text, TOOLS)
    assert result.tool_calls == [
        ToolCall(name="search", arguments={"query": "flax nnx", "k": 3}),
        ToolCall(name="calculator", arguments={"expression": "2**10"}),
    ]
    assert result.text == "I will search."


def test_gemma_print_wrapper_and_bracketed_list_form() -> None:
    parser = make_parser("gemma")
    wrapped = parser.parse('```tool_code\nprint(calculator(expression="1+1"))\n```', TOOLS)
    assert wrapped.tool_calls == [ToolCall(name="calculator", arguments={"expression": "1+1"})]
    listed = parser.parse('[calculator(expression="3"), search(query="q")]', TOOLS)
    assert listed.tool_calls == [
        ToolCall(name="calculator", arguments={"expression": "3"}),
        ToolCall(name="search", arguments={"query": "q"}),
    ]
    answer = parser.parse("[1, 2]", TOOLS)  # a bracketed answer is not a call
    assert not answer.has_calls and answer.text == "[1, 2]"


MALFORMED = [
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"</tool_call>', "bad_json"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}', "bad_format"),
    ("hermes", '<tool_call>["calculator"]</tool_call>', "bad_format"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "bad_format"),
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown_tool"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>', "bad_arguments"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": 5}}</tool_call>', "bad_arguments"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "bad_arguments"),
    ("hermes", '<tool_call>{"name": "search", "arguments": {"query": "a", "k": true}}</tool_call>', "bad_arguments"),
    ("hermes", '<tool_call>{"name": "search", "arguments": {"query": "a", "extra": 1}}</tool_call>', "bad_arguments"),
    ("hermes", "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": "1" * 5000}}) + "</tool_call>", "too_large"),
    ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "1", "x": [[[[["deep"]]]]]}}</tool_call>', "too_deep"),
    ("hermes", "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>", "bad_json"),
    ("llama3", '{"name": "calculator", "parameters": {"expression": ', "bad_json"),
    ("llama3", '<|python_tag|>{"name": "nope", "parameters": {}}', "unknown_tool"),
    ("llama3", "<|python_tag|>[1, 2]", "bad_format"),
    ("gemma", "```tool_code\ncalculator(\n```", "bad_format"),
    ("gemma", '```tool_code\ncalculator("2+3")\n```', "bad_arguments"),
    ("gemma", "```tool_code\ncalculator(expression=__import__('os').system('x'))\n```", "bad_arguments"),
    ("gemma", '```tool_code\nos.system(cmd="ls")\n```', "bad_format"),
    ("gemma", '```tool_code\ncalculator(expression="1")', "bad_format"),
    ("gemma", '```tool_code\ncalculator(expression="\x00")\n```', "bad_format"),
    ("gemma", "```tool_code\ncalculator(expression=" + "9" * 5000 + ")\n```", "bad_format"),
    ("gemma", '[calculator(expression=1)]', "bad_arguments"),
]


@pytest.mark.parametrize(("parser", "text", "kind"), MALFORMED)
def test_malformed_call_becomes_error_not_exception(parser: str, text: str, kind: str) -> None:
    result = make_parser(parser).parse(text, TOOLS)
    assert result.tool_calls == []
    assert [e.kind for e in result.errors] == [kind]
    assert result.has_calls  # the agent answers with an error message instead of scoring the text
    assert result.errors[0].message


def test_unknown_tool_error_names_the_available_tools() -> None:
    (err,) = make_parser("hermes").parse('<tool_call>{"name": "calc", "arguments": {}}</tool_call>', TOOLS).errors
    assert err.name == "calc"
    assert "calculator, search" in err.message


def test_calls_beyond_the_limit_become_errors() -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    result = make_parser("hermes").parse(call * 3, TOOLS, ParserLimits(max_calls=2))
    assert len(result.tool_calls) == 2
    assert [e.kind for e in result.errors] == ["bad_format"]


def test_valid_and_broken_calls_in_one_response_are_separated() -> None:
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {</tool_call>'
    )
    result = make_parser("hermes").parse(text, TOOLS)
    assert result.tool_calls == [ToolCall(name="calculator", arguments={"expression": "1+1"})]
    assert [e.kind for e in result.errors] == ["bad_json"]


def test_unknown_parser_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"\['gemma', 'hermes', 'llama3', 'qwen'\]"):
        make_parser("mistral")


FRAGMENTS = ["<tool_call>", "</tool_call>", '{"name": "calculator", "arguments": {', '"expression": "1"}}', "}", "]",
             "<|python_tag|>", "```tool_code\n", "calculator(expression='2')", "\n```", "[", "(", "print(", "\x00"]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=12))
def test_no_input_makes_any_parser_raise(pieces: list[str]) -> None:
    text = "".join(pieces)
    for name in PARSER_REGISTRY:
        result = make_parser(name).parse(text, TOOLS)
        assert all(call.name in TOOLS for call in result.tool_calls)


# -- bounded work: huge integers, floods, long responses -----------------------------------------------------

HUGE_INT_CALLS = {
    "hermes": lambda digits: f'<tool_call>{{"name": "calculator", "arguments": {{"expression": {digits}}}}}</tool_call>',
    "llama3": lambda digits: f'{{"name": "search", "parameters": {{"query": "q", "k": {digits}}}}}',
    "gemma": lambda digits: f"```tool_code\ncalculator(expression={digits})\n```",
}


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(HUGE_INT_CALLS)), st.integers(MAX_INT_DIGITS + 1, 30_000), st.booleans())
def test_an_integer_past_pythons_digit_limit_is_an_error_not_an_exception(parser: str, digits: int,
                                                                          negative: bool) -> None:
    text = HUGE_INT_CALLS[parser](("-" if negative else "") + "7" * digits)
    result = make_parser(parser).parse(text, TOOLS)
    assert result.tool_calls == []
    assert len(result.errors) == 1 and result.errors[0].kind in ("bad_json", "bad_format", "bad_arguments")


def test_an_integer_within_the_limit_is_read() -> None:
    text = HUGE_INT_CALLS["llama3"]("7" * MAX_INT_DIGITS)
    (call,) = make_parser("llama3").parse(text, TOOLS, ParserLimits(max_argument_chars=5000)).tool_calls
    assert call.arguments["k"] == int("7" * MAX_INT_DIGITS)


FLOOD_UNITS = ["<tool_call>", "<tool_call>{", '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}'
               "</tool_call>", '{"name": "calculator", "parameters": {"expression": "1"}};', "```tool_code\n",
               "calculator(expression='1')\n", "calculator(expression='1'), ", "[", "</tool_call>"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PARSER_REGISTRY)), st.lists(st.sampled_from(FLOOD_UNITS), min_size=1, max_size=3),
       st.integers(1, 30_000), st.sampled_from(["", "[", "```tool_code\n", "<|python_tag|>"]),
       st.integers(1, 12))
def test_a_flood_gives_at_most_max_calls_plus_two_messages(parser: str, units: list[str], n: int, prefix: str,
                                                           max_calls: int) -> None:
    limits = ParserLimits(max_calls=max_calls)
    result = make_parser(parser).parse(prefix + "".join(units) * n, TOOLS, limits)
    assert len(result.tool_calls) <= max_calls
    assert len(result.tool_calls) + len(result.errors) <= max_calls + 2  # each becomes one tool message


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PARSER_REGISTRY)), st.sampled_from(FLOOD_UNITS), st.text(max_size=50),
       st.text(max_size=50))
def test_nothing_past_max_scan_chars_is_searched(parser: str, unit: str, tail_a: str, tail_b: str) -> None:
    limits = ParserLimits(max_scan_chars=1000)
    head = (unit * (1 + 1000 // len(unit)))[:1000]
    a, b = (make_parser(parser).parse(head + tail, TOOLS, limits) for tail in (tail_a + "x", tail_b + "y"))
    assert (a.tool_calls, a.errors[:-1]) == (b.tool_calls, b.errors[:-1])
    assert a.errors[-1].kind == b.errors[-1].kind == "too_large"


_FLOODS = """
import sys
from pipelines_lib.agents.parsers import make_parser
tools = {"calculator": {"type": "object", "properties": {"expression": {"type": "string"}}}}
call = "calculator(expression='1')"
floods = [("hermes", "<tool_call>" * 20_000), ("hermes", "<tool_call>{" * 20_000 + "</tool_call>"),
          ("gemma", "```tool_code\\n" + (call + "\\n") * 5_000 + "```"), ("gemma", "[" + ", ".join([call] * 2_000) + "]"),
          ("llama3", "; ".join(['{"name": "calculator", "parameters": {"expression": "1"}}'] * 5_000)),
          ("hermes", '<tool_call>{"name": "calculator", "arguments": {"x": ' + "9" * 50_000 + "}}</tool_call>")]
for _ in range(20):  # each flood 20 times: about 20 x 140 s before the parsers were linear and capped
    for name, text in floods:
        make_parser(name).parse(text, tools)
print("ok")
"""


def test_the_reported_floods_parse_twenty_times_within_a_generous_budget() -> None:
    # 20 k unclosed <tool_call> tags took 41 s and 5,000 Gemma calls 97 s (quadratic scans); capped and linear,
    # all six floods 20 times over take well under a second. The budget catches a quadratic scan coming back.
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", _FLOODS], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["ok"], out.stderr
