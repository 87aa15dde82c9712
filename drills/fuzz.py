"""Hostile and malformed input, property-based: every entry point that reads untrusted bytes or text.

Each ``FuzzTarget`` pairs a hypothesis strategy (hostile inputs, built lazily so importing this module does
not import hypothesis) with a ``check`` that states the entry point's contract and raises
``ContractViolation`` when it is broken. Anything else a check raises is a crash of the code under test.

| target | entry point | contract |
|---|---|---|
| ``parsers`` | every ``PARSER_REGISTRY`` parser | never raises (huge JSON integers, floods of calls and unclosed tags included); errors are known kinds with a message; calls name offered tools with object arguments; at most ``max_calls + 2`` results |
| ``calculator`` | ``Calculator`` tool, ``evaluate`` | a number or ``ToolError`` with a message, within ``CASE_TIME_S`` |
| ``config`` | ``CampaignConfig.from_yaml`` | a bad config never loads: only ``ConfigError``, naming the file and the offending dotted key; "did you mean" for typos; aliases, duplicate keys, non-UTF-8 refused |
| ``shards`` | ``decode_shard`` and ``ShardTailer`` | only ``ShardError`` naming the shard; the tailer never raises, it records a ``skipped`` event |
| ``dataset`` | ``dataset.prep`` with a file source | only ``DatasetError`` naming the file |
| ``campaigns`` | the operator's commands on random edits of a real campaign (``drills.fuzz_campaign``) | a report, or exit 2 with one line naming the command; never a traceback |

``tests/test_fuzz.py`` runs each target under ``@given`` (500 cases, failures shrink); ``run_fuzz`` runs the
same targets through ``counted`` for the ``reliability.fuzz_cases`` / ``fuzz_crashes`` figures.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from drills import fuzz_campaign
from drills.fuzz_arrow import ContractViolation, ipc, with_meta
from pipelines_lib.storage import layout

CASE_TIME_S = 1.0
"""Longest a single calculator case may take (the calculator promises microseconds; 1 s leaves room for a
loaded machine while still catching any computation that runs away)."""

TOOLS: dict[str, dict[str, Any]] = {
    "calculator": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    "search": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
               "required": ["query"], "additionalProperties": False},
}
"""Tools offered to the parsers: one permissive schema, one strict."""

SHARD_WHERE = layout.shard_path(0, "fuzz.0", 0)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ContractViolation(message)


# -- checks ---------------------------------------------------------------------------------------------

def check_parsers(text: str) -> None:
    from pipelines_lib.agents.parsers import (
        ERROR_KINDS,
        PARSER_REGISTRY,
        ParseResult,
        ParserLimits,
        ToolCall,
        make_parser,
    )

    for name in {cls: name for name, cls in PARSER_REGISTRY.items()}.values():  # aliases share a class
        result = make_parser(name).parse(text, TOOLS)
        _require(isinstance(result, ParseResult), f"{name}: returned {type(result).__name__}")
        for call in result.tool_calls:
            _require(isinstance(call, ToolCall) and call.name in TOOLS and isinstance(call.arguments, dict),
                     f"{name}: accepted an invalid call {call!r}")
        for err in result.errors:
            _require(err.kind in ERROR_KINDS and bool(err.message.strip()), f"{name}: unclear error {err!r}")
        limit = ParserLimits().max_calls
        _require(len(result.tool_calls) + len(result.errors) <= limit + 2,
                 f"{name}: {len(result.tool_calls)} calls and {len(result.errors)} errors (bound {limit + 2})")


def check_calculator(case: str | dict[str, Any]) -> None:
    from pipelines_lib.envs.base import ToolError
    from pipelines_lib.envs.tools.calculator import Calculator

    arguments = case if isinstance(case, dict) else {"expression": case}
    start = time.perf_counter()
    try:
        out = asyncio.run(Calculator()(arguments))
        _require(isinstance(out, str) and bool(out), f"result {out!r} is not text")
    except ToolError as e:
        _require(bool(str(e).strip()), "ToolError without a message")
    elapsed = time.perf_counter() - start
    _require(elapsed < CASE_TIME_S, f"took {elapsed:.2f}s (bound {CASE_TIME_S}s)")


@dataclass(frozen=True, kw_only=True)
class ConfigCase:
    """A YAML document plus what its error must name (``None`` for free-form text)."""

    text: str
    key: str | None = None
    """Dotted key that was mutated."""
    typo_of: str | None = None
    """For a misspelt key: the real key the "did you mean" must propose."""
    bad: bool = True
    """The config must be refused (False only for free-form text, which may happen to be a valid config)."""
    data: bytes | None = None
    """The file's bytes when they are not UTF-8 text (``text`` then describes them)."""


def check_config(case: ConfigCase) -> None:
    from pipelines_lib.config import CampaignConfig, ConfigError

    with tempfile.TemporaryDirectory(prefix="rollstream-fuzz-") as d:
        path = Path(d) / "campaign.yaml"
        path.write_bytes(case.data if case.data is not None else case.text.encode())
        try:
            CampaignConfig.from_yaml(path)
            _require(not case.bad, f"a bad config loaded: {case.text[:200]!r}")
        except ConfigError as e:
            msg = str(e)
            _require(str(path) in msg, f"error does not name the file: {msg!r}")
            if case.key is not None:
                parent, _, leaf = case.key.rpartition(".")
                _require(case.key in msg or (leaf in msg and parent.rpartition(".")[2] in msg),
                         f"error does not name {case.key!r}: {msg!r}")
            if case.typo_of is not None:
                _require(f"did you mean {case.typo_of!r}" in msg, f"no 'did you mean {case.typo_of!r}': {msg!r}")


def check_shard(data: bytes) -> None:
    from pipelines_lib.storage.store import Store
    from pipelines_lib.trajectory.codec import ShardError, decode_shard
    from pipelines_lib.trajectory.folder import FolderChannel
    from pipelines_lib.trajectory.window import Window

    try:
        table, provenance = decode_shard(data, SHARD_WHERE)
        _require(isinstance(table, pa.Table) and isinstance(provenance, dict), "decoded to the wrong types")
        readable = True
    except ShardError as e:
        _require(SHARD_WHERE in str(e), f"ShardError does not name the shard: {e}")
        readable = False
    with tempfile.TemporaryDirectory(prefix="rollstream-fuzz-") as d:
        store = Store(d)
        store.create(SHARD_WHERE, data)
        tailer = FolderChannel(store).reader()
        groups = tailer.next_groups(10_000, Window(version=0, eta=0))
        events = tailer.drain_events()
        if readable:
            # A readable shard may still be one the trainer must not use (a copy, interleaved groups): then
            # every group it holds is skipped with a reason instead.
            skipped = {g for e in events if e.kind == "skipped" and e.reason for g in e.groups}
            _require(bool(groups) or table.num_rows == 0
                     or skipped == set(table.column("group_id").to_pylist()),
                     f"a readable shard handed out no groups and skipped {skipped}")
        else:
            _require(not groups and len(events) == 1 and events[0].kind == "skipped"
                     and SHARD_WHERE in events[0].shard, f"unreadable shard not recorded as skipped: {events}")


@dataclass(frozen=True, kw_only=True)
class DatasetCase:
    suffix: str
    data: bytes


def check_dataset(case: DatasetCase) -> None:
    from pipelines_lib.dataset import DatasetConfig, DatasetError, prep
    from pipelines_lib.storage.store import Store

    with tempfile.TemporaryDirectory(prefix="rollstream-fuzz-") as d:
        source = Path(d) / f"tasks{case.suffix}"
        source.write_bytes(case.data)
        try:
            manifest = prep(Store(str(Path(d) / "campaign")), DatasetConfig(source=str(source)))
            _require(all(s["rows"] > 0 for s in manifest["splits"].values()), f"empty split in {manifest}")
        except DatasetError as e:
            _require(str(source) in str(e), f"DatasetError does not name the file: {e}")


# -- strategies -----------------------------------------------------------------------------------------

def _json_values(st: Any) -> Any:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8),
                        inner, max_size=4), max_leaves=20)


def parser_inputs() -> Any:
    import hypothesis.strategies as st

    names = st.sampled_from([*TOOLS, "rm_rf", "", "calculator ", "CALCULATOR"]) | st.text(max_size=20)
    args = _json_values(st) | st.dictionaries(st.sampled_from(["expression", "query", "k", "x"]), _json_values(st),
                                              max_size=4)
    huge = st.integers(1, 20_000).map(lambda n: {"expression": "1+" * n + "1"})
    deep = st.integers(1, 3_000).map(lambda n: json.loads("[" * min(n, 900) + "]" * min(n, 900)) if n < 900
                                     else {"expression": "x"})
    call_obj = st.fixed_dictionaries({"name": names, "arguments": args | huge | deep})
    raw_json = st.integers(1, 3_000).map(lambda n: '{"name": "calculator", "arguments": ' + "{\"a\": " * n
                                           + "1" + "}" * n + "}")
    payload = call_obj.map(json.dumps) | raw_json | st.text(max_size=200)
    cut = st.tuples(payload, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    hermes = st.lists(payload | cut, max_size=10).map(lambda ps: "".join(f"<tool_call>{p}</tool_call>" for p in ps))
    hermes_open = payload.map(lambda p: f"thinking <tool_call>{p}")
    llama = st.lists(call_obj.map(lambda c: json.dumps({"name": c["name"], "parameters": c["arguments"]})) | cut,
                     min_size=1, max_size=10).map(lambda cs: "<|python_tag|>" + ";".join(cs))
    py_args = st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                              st.sampled_from(["1", "'x'", "[1, 2]", "{'a': (1,)}", "__import__('os')", "1+",
                                               "(" * 200 + "1" + ")" * 200, "x" * 5000, "f(g(h()))"]), max_size=4)
    py_call = st.tuples(names, py_args).map(lambda t: f"{t[0]}(" + ", ".join(f"{k}={v}" for k, v in t[1].items())
                                            + ")")
    gemma = st.lists(py_call | st.text(max_size=40), max_size=10).map(lambda cs: "```tool_code\n" + "\n".join(cs)
                                                                     + "\n```")
    gemma_list = st.lists(py_call, min_size=1, max_size=10).map(lambda cs: "[" + ", ".join(cs) + "]")
    nested_py = st.integers(1, 3_000).map(lambda n: "```tool_code\ncalculator(expression=" + "[" * n + "]" * n
                                           + ")\n```")
    big_int = st.integers(4_000, 12_000).map(lambda n: "9" * n)
    huge_ints = big_int.flatmap(lambda d: st.sampled_from([
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": {d}}}}}</tool_call>',
        f'<tool_call>{{"name": {d}, "arguments": {{}}}}</tool_call>',
        f'{{"name": "search", "parameters": {{"query": "q", "k": -{d}}}}}',
        f"```tool_code\ncalculator(expression={d})\n```"]))
    flood_unit = st.sampled_from(["<tool_call>", "<tool_call>{", "```tool_code\n", "calculator(expression='1')\n",
                                  '{"name": "calculator", "parameters": {}};', "</tool_call>"])
    floods = st.tuples(flood_unit, st.integers(100, 20_000)).map(lambda t: t[0] * t[1])
    return st.one_of(st.text(max_size=500), hermes, hermes_open, llama, gemma, gemma_list, nested_py, huge_ints, floods,
                     st.tuples(st.text(max_size=50), hermes | llama | gemma).map("".join))


def calculator_inputs() -> Any:
    import hypothesis.strategies as st

    numbers = st.sampled_from(["9", "2", "0", "1", "-1", "0.5", "1e308", "99999999999999999999", "10**10", "1e-320"])
    ops = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "^", "×", "÷"])

    def combine(inner: Any) -> Any:
        return st.tuples(inner, ops, inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})")

    exprs = st.recursive(numbers, combine, max_leaves=30)
    towers = st.tuples(numbers, st.integers(2, 12)).map(lambda t: "**".join([t[0]] * t[1]))
    nested = st.tuples(st.integers(1, 10_000), st.sampled_from(["(", "-", "+", "-(", "2**("])).map(
        lambda t: t[1] * t[0] + "1" + (")" * t[0] if "(" in t[1] else ""))
    factorials = st.integers(1, 10**9).map(lambda n: f"factorial({n})") | st.integers(2, 400).map(
        lambda n: "*".join(str(i) for i in range(1, n)))
    calls = st.sampled_from(["__import__('os').system('true')", "().__class__", "[1]*10**9", "'a'*10**9",
                             "lambda: 1", "9**9**9", "(-9)**(9**9)", "10**-400", "0**-1", "1/0", "2**0.5**-1"])
    wrong_args = st.dictionaries(st.sampled_from(["expression", "expr", ""]), _json_values(st), max_size=3)
    return st.one_of(exprs, towers, nested, factorials, calls, st.text(max_size=300), wrong_args)


def _config_leaves() -> dict[str, Any]:
    from pipelines_lib.config import CampaignConfig

    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node and prefix.rpartition(".")[2] != "columns":
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else k)
        else:
            out[prefix] = node

    walk(CampaignConfig.tiny().to_dict(), "")
    return out


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    *parents, leaf = dotted.split(".")
    node: dict[str, Any] = {leaf: value}
    for p in reversed(parents):
        node = {p: node}
    return node


def _typo(key: str, i: int) -> str:
    i %= len(key)
    return key[:i] + key[i + 1:] if len(key) > 3 else key + "x"


CONFIG_RANGE_CASES: tuple[tuple[str, str], ...] = (
    ("rollout.temperature", ".nan"), ("rollout.temperature", "-0.5"), ("eval.temperature", ".nan"),
    ("trainer.optim.lr", "1e999"), ("trainer.optim.lr", "-.inf"), ("rollout.group_size", "1"),
    ("rollout.max_concurrency", "400000000000"), ("engine.num_slots", "1000000000"),
    ("trainer.data_timeout_s", ".inf"), ("rollout.episode_timeout_s", ".nan"), ("workers", "9" * 5000),
    ("sft.error_rate", "1e400"), ("eval.max_concurrency", "100000000"),
)
"""Well-typed values out of range or not finite (each knob's own check or the finiteness rule refuses them)."""

CONFIG_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
"""A few hundred bytes of nested aliases that expand to 9**9 (~387 M) scalars if a loader follows them."""


def _bad_values(default: Any) -> Any:
    """Values of a type no knob with this default accepts (the knob's type is its default's; ``None`` defaults
    are optional, so only a mapping is surely wrong)."""
    import hypothesis.strategies as st

    from pipelines_lib.configio import _YAML11_EXPONENT

    mappings = st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), min_size=1, max_size=2)
    lists = st.lists(st.integers(-5, 5), max_size=3)
    if isinstance(default, bool):
        return st.one_of(st.integers(), st.text(max_size=10), lists, mappings)
    if isinstance(default, int):
        return st.one_of(st.text(max_size=10), st.floats(), st.booleans(), lists, mappings,
                         st.integers(2**63, 10**30), st.integers(-(10**30), -(2**63)))
    if isinstance(default, float):
        not_finite = st.sampled_from([math.nan, -math.inf] + ([] if default == math.inf else [math.inf]))
        return st.one_of(st.text(max_size=10).filter(lambda t: not _YAML11_EXPONENT.fullmatch(t.strip())),
                         not_finite, st.booleans(), lists, mappings)
    if isinstance(default, str):
        return st.one_of(st.integers(), st.floats(), st.booleans(), lists, mappings)
    if isinstance(default, list):
        return st.one_of(st.integers(), st.text(max_size=10), mappings)
    if isinstance(default, dict):
        return st.one_of(st.integers(), st.text(max_size=10), lists)
    return mappings


def config_inputs() -> Any:
    import hypothesis.strategies as st
    import yaml

    leaves = _config_leaves()

    def wrong(t: tuple[str, Any]) -> ConfigCase:
        key, value = t
        return ConfigCase(text=yaml.safe_dump(_nest(key, value)), key=key)

    mutated = st.sampled_from(sorted(leaves)).flatmap(
        lambda key: st.tuples(st.just(key), _bad_values(leaves[key]))).map(wrong)
    out_of_range = st.sampled_from(CONFIG_RANGE_CASES).map(
        lambda kv: ConfigCase(text=_nested_text(kv[0], kv[1]), key=kv[0]))

    def misspelt(t: tuple[str, int]) -> ConfigCase:
        key, i = t
        parent, _, leaf = key.rpartition(".")
        bad = _typo(leaf, i)
        siblings = {k.rpartition(".")[2] for k in leaves if k.rpartition(".")[0] == parent} | {
            k[len(parent) + 1:].split(".")[0] for k in leaves if parent and k.startswith(parent + ".")}
        if bad in siblings:
            return ConfigCase(text=yaml.safe_dump(_nest(key, leaves[key])), bad=False)
        import difflib

        close = difflib.get_close_matches(bad, sorted(siblings), n=1)
        dotted = f"{parent}.{bad}" if parent else bad
        return ConfigCase(text=yaml.safe_dump(_nest(dotted, 1)), key=dotted, typo_of=close[0] if close else None)

    typos = st.tuples(st.sampled_from(sorted(leaves)), st.integers(0, 40)).map(misspelt)
    hostile = st.one_of(
        st.integers(1, 1_200).map(lambda n: "a: " + "[" * n + "]" * n),
        st.sampled_from(["- 1\n- 2", "a: &x [*x]", "!!python/object:os.system 'true'", "{", "rollout: 3",
                         "rollout:\n  eta: !!binary aGk=", "\t", "a: 1\na: 2", "workers: 2\nworkers: 3",
                         "rollout: {eta: 1, eta: 2}", CONFIG_BOMB, "base: &b {eta: 1}\nrollout: *b"]))
    not_utf8 = st.binary(min_size=1, max_size=50).filter(_not_utf8).map(
        lambda b: ConfigCase(text=f"bytes {b!r}", data=b"workers: 2\n" + b))
    free = st.text(max_size=200).map(lambda t: ConfigCase(text=t, bad=False))
    return st.one_of(mutated, out_of_range, typos, hostile.map(lambda t: ConfigCase(text=t)), not_utf8, free)


def _nested_text(dotted: str, scalar: str) -> str:
    """YAML for ``dotted: scalar`` with the scalar written verbatim (``.nan``, ``1e999``: YAML spellings)."""
    *parents, leaf = dotted.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parents)]
    return "\n".join([*lines, f"{'  ' * len(parents)}{leaf}: {scalar}"]) + "\n"


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _valid_shard(n_groups: int, seed: int) -> bytes:
    from pipelines_lib.trajectory.codec import encode_shard
    from pipelines_lib.trajectory.record import to_table
    from pipelines_lib.trajectory.synthetic import synthetic_group

    rows = [t for g in range(n_groups) for t in synthetic_group(prompt_id=f"p{g}", group_size=2, worker_id="fuzz.0",
                                                                  policy_version=0, seed=seed + g, max_len=24)]
    return encode_shard(to_table(rows), {"worker_id": "fuzz.0", "seq": 0})


def shard_inputs() -> Any:
    import hypothesis.strategies as st

    from pipelines_lib.trajectory.codec import SHARD_META_KEY
    from pipelines_lib.trajectory.schema import SCHEMA_VERSION_KEY

    valid = st.tuples(st.integers(1, 3), st.integers(0, 1000)).map(lambda t: _valid_shard(*t))
    truncated = st.tuples(valid, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    flipped = st.tuples(valid, st.integers(0, 10**6), st.integers(1, 255)).map(
        lambda t: t[0][: t[1] % len(t[0])] + bytes([t[0][t[1] % len(t[0])] ^ t[2]]) + t[0][t[1] % len(t[0]) + 1:])
    versions = st.sampled_from(["2.0", "0.9", "1.7", "x", "", "1", "999999999999999999999.0", "-1.0", "1.0.0"])
    future = st.tuples(valid, versions).map(lambda t: with_meta(t[0], SCHEMA_VERSION_KEY, t[1].encode()))
    provenance = st.sampled_from([b"", b"{", b"[1, 2]", b"null", b"\xff\xfe", b'"x"', b'{"seq": "NaN"}'])
    bad_prov = st.tuples(valid, provenance).map(lambda t: with_meta(t[0], SHARD_META_KEY, t[1]))
    other = st.dictionaries(st.text(min_size=1, max_size=8), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2,
                                                                         max_size=2),
                            min_size=1, max_size=3).map(lambda d: ipc(pa.table(d)))
    dataset_file = st.just(ipc(pa.table({"task_id": ["a"], "prompt": ["1+1"], "answer": ["2"]})))
    parquet = st.just(0).map(lambda _: _parquet(pa.table({"x": [1, 2]})))
    return st.one_of(st.binary(max_size=2000), st.just(b""), valid, truncated, flipped, future, bad_prov, other,
                     dataset_file, parquet)


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def dataset_inputs() -> Any:
    import hypothesis.strategies as st

    good = {"task_id": "t1", "prompt": "What is 2+2?", "answer": "4"}
    row = st.one_of(st.just(good), st.fixed_dictionaries({"task_id": st.text(max_size=5) | st.integers(),
                                                          "prompt": st.text(max_size=20) | st.none(),
                                                          "answer": _json_values(st)}),
                    st.dictionaries(st.text(max_size=6), _json_values(st), max_size=4),
                    st.fixed_dictionaries({"task_id": st.text(min_size=1, max_size=8), "prompt": st.just("q"),
                                           "answer": st.just("a"), "meta": _json_values(st),
                                           "env_name": st.sampled_from(["arithmetic", "nope", ""]) | st.integers()}))
    lines = st.lists(row.map(json.dumps) | st.text(max_size=40), max_size=40).map(lambda ls: "\n".join(ls).encode())
    many_good = st.integers(1, 60).map(lambda n: "\n".join(json.dumps({**good, "task_id": f"t{i}"})
                                                           for i in range(n)).encode())
    tabular = st.lists(row, min_size=1, max_size=20)

    def as_table(rows: list[dict[str, Any]]) -> pa.Table:
        try:
            return pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            return pa.table({"task_id": [str(i) for i in range(len(rows))]})

    def encoded(rows: list[dict[str, Any]], suffix: str) -> DatasetCase:
        table = as_table(rows)
        try:
            return DatasetCase(suffix=suffix, data=ipc(table) if suffix == ".arrow" else _parquet(table))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. Parquet cannot store an empty struct
            return DatasetCase(suffix=suffix, data=b"")

    arrow = tabular.map(lambda rs: encoded(rs, ".arrow"))
    parquet = tabular.map(lambda rs: encoded(rs, ".parquet"))
    raw = st.tuples(st.sampled_from([".jsonl", ".parquet", ".arrow", ".csv", ".json", ""]),
                    st.binary(max_size=500) | lines | many_good)
    truncated = st.tuples(arrow | parquet, st.floats(0, 1)).map(
        lambda t: DatasetCase(suffix=t[0].suffix, data=t[0].data[: int(len(t[0].data) * t[1])]))
    return st.one_of(raw.map(lambda t: DatasetCase(suffix=t[0], data=t[1])), arrow, parquet, truncated,
                     st.builds(DatasetCase, suffix=st.just(".jsonl"), data=lines | many_good))


# -- registry and counting runner -----------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class FuzzTarget:
    name: str
    strategy: Callable[[], Any]
    """Builds the hypothesis strategy (hypothesis is imported only when fuzzing)."""
    check: Callable[[Any], None]


FUZZ_TARGETS: dict[str, FuzzTarget] = {t.name: t for t in (
    FuzzTarget(name="parsers", strategy=parser_inputs, check=check_parsers),
    FuzzTarget(name="calculator", strategy=calculator_inputs, check=check_calculator),
    FuzzTarget(name="config", strategy=config_inputs, check=check_config),
    FuzzTarget(name="shards", strategy=shard_inputs, check=check_shard),
    FuzzTarget(name="dataset", strategy=dataset_inputs, check=check_dataset),
    FuzzTarget(name="campaigns", strategy=lambda: fuzz_campaign.campaign_inputs(),
               check=lambda case: fuzz_campaign.check_campaign(case)),
)}


@dataclass
class Tally:
    """Cases run and crashes (exceptions of any kind out of a check) for one target."""

    cases: int = 0
    crashes: int = 0
    examples: list[str] = field(default_factory=list)
    """The first few crashing inputs with their errors."""

    def counted(self, check: Callable[[Any], None]) -> Callable[[Any], None]:
        """``check`` that counts instead of raising, so a run goes on past a crash and reports them all."""
        def wrapped(value: Any) -> None:
            self.cases += 1
            try:
                check(value)
            except Exception as e:  # noqa: BLE001 - every failure is the figure being measured
                self.crashes += 1
                if len(self.examples) < 5:
                    self.examples.append(f"{type(e).__name__}: {str(e)[:300]} <- {repr(value)[:200]}")
        return wrapped


def run_fuzz(max_examples: int = 500, *, seed: int = 0, names: list[str] | None = None) -> dict[str, Tally]:
    """Run every (or the named) target for ``max_examples`` cases; deterministic for a seed."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hyp_seed

    tallies: dict[str, Tally] = {}
    for name in names or list(FUZZ_TARGETS):
        target = FUZZ_TARGETS[name]
        tally = tallies[name] = Tally()
        run = hyp_seed(seed)(settings(max_examples=max_examples, deadline=None, database=None,
                                      suppress_health_check=list(HealthCheck))(
            given(target.strategy())(tally.counted(target.check))))
        run()
    return tallies


__all__ = ["CASE_TIME_S", "FUZZ_TARGETS", "ConfigCase", "DatasetCase", "FuzzTarget", "Tally",
           "check_calculator", "check_config", "check_dataset", "check_parsers", "check_shard", "run_fuzz"]
