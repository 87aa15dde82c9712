"""Typed configs from plain data: the one place YAML/JSON mappings become frozen dataclasses.

``from_mapping(Cls, data)`` builds nested kw_only dataclasses field by field, so a bad config fails with the
dotted path of the offending key: unknown keys get a "did you mean", wrong types name the expected type, and
each dataclass's own ``__post_init__`` checks ranges. Numbers must be finite (``.nan``, ``.inf`` and ``1e999``
are refused), except that a knob declared with ``no_limit(default)`` (where ``inf`` disables a cap, e.g.
``grad_clip_norm``) may be ``.inf``; every integer must fit in 64 bits. ``to_mapping`` is the inverse (for ``campaign.json``).

``load_yaml(path)`` reads a config file for it with bounded work: at most ``MAX_CONFIG_BYTES``, UTF-8 only, no
anchors or aliases (a few hundred bytes of nested aliases expand to gigabytes), no duplicate keys (the second
would silently win); every error names the file and, where YAML knows it, the line.

Why this is not pydantic (a dependency: ``flows/params.py`` generates the Prefect forms' models with it):
``pydantic.TypeAdapter(CampaignConfig)`` validates ``CampaignConfig.tiny()`` much faster than this module, but as it stands it accepts ``trainer.max_stepz`` (a typo) and a 70-bit ``trainer.max_steps`` without a
word, and reports a wrong type as a four-line block ending in a URL where this says
``trainer.max_steps: expected int, got str 'many'``. Making it refuse what this module refuses needs the same
hooks on every dataclass (extra keys forbidden with a "did you mean", 64-bit integers, finite floats but
``no_limit`` knobs), i.e. this module again inside validators; 7 checks in 5 tests of ``tests/test_config.py`` and the
500-example fuzz of ``tests/test_fuzz_config.py`` pin the messages. Config loading is not on a hot path.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (a campaign config is a few kilobytes)."""
INT64_MAX = 2**63 - 1
"""No integer knob may exceed a signed 64-bit integer (what NumPy and JAX take)."""

_YAML11_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""Exponent notation that YAML 1.1 (PyYAML) leaves a string unless it has a dot: ``1e-3``."""


def no_limit(default: float) -> Any:
    """A float knob's ``field`` for which ``inf`` means "no limit" (the only knobs that may be infinite)."""
    return dataclasses.field(default=default, metadata={_NO_LIMIT: True})


_NO_LIMIT = "rollstream.no_limit"


class ConfigError(ValueError):
    """A config value is wrong; the message names its dotted path."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases or duplicate keys (see the module docstring)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise yaml.MarkedYAMLError(problem="anchors and aliases (&name, *name) are not allowed in a config",
                                       problem_mark=mark)
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | str:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # past Python's int-to-str digit limit: kept as text, refused where a number is due
            return str(self.construct_scalar(node))

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it with its position
                break
            if duplicate:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` as YAML under ``_StrictLoader``; any problem is a ``ConfigError`` starting with ``where``."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{where}: {e.problem or e.context}{at}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"{where}: not valid YAML ({type(e).__name__}: {e})") from None


def parse_overrides(items: Sequence[str], *, flag: str = "--set") -> dict[str, Any]:
    """``["trainer.optim.lr=1e-4", ...]`` (command-line ``KEY=VALUE`` items) → ``{"trainer.optim.lr": 0.0001}``,
    each value read as YAML; a malformed item is a ``ConfigError`` naming ``flag`` and the item."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects key=value, got {item!r}")
        out[key] = parse_yaml(value, f"{flag} {key}")
    return out


def nest_dotted(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """``{"trainer.optim.lr": 1e-4}`` → ``{"trainer": {"optim": {"lr": 1e-4}}}`` (dotted overrides as a mapping)."""
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def load_yaml(path: str | Path) -> Any:
    """The YAML document in file ``path`` (see the module docstring); errors are ``ConfigError`` naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({type(e).__name__}: {e.strerror or e})") from e
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None
    return parse_yaml(text, str(path))


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, where: str, allow_inf: bool = False) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where, allow_inf)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {_type_name(tp)}")
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {list(choices)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {type(value).__name__} {value!r}")
        return from_mapping(tp, value, where=where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        items = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        number = value
        if isinstance(value, str) and _YAML11_EXPONENT.fullmatch(value.strip()):
            number = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; everyone means the number
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        try:
            number = float(number)
        except OverflowError:
            number = math.inf
        if not (math.isfinite(number) or (allow_inf and number == math.inf)):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp in (int, str, bool):
        if type(value) is not tp:
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {_short(value)}")
        if tp is int and abs(value) > INT64_MAX:
            raise ConfigError(f"{where}: {_short(value)} does not fit in a 64-bit integer")
        return value
    return value


def _short(value: Any) -> str:
    """``repr`` of a bad value, cut (a fuzzed 10**4000 has no useful digits past the first few; its repr would
    even exceed Python's int-to-str limit)."""
    if isinstance(value, int) and abs(value) > 10**60:
        return f"an integer of about {value.bit_length() * 30103 // 100000} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def from_mapping(cls: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; missing keys keep their defaults."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {sorted(fields)}"
            raise ConfigError(f"{path}: unknown key for {cls.__name__}{hint}")
        kwargs[key] = _convert(hints[key], value, path, allow_inf=fields[key].metadata.get(_NO_LIMIT, False))
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def to_mapping(obj: Any) -> Any:
    """Plain JSON-able data of a (nested) config dataclass."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_mapping(v) for k, v in obj.items()}
    return obj
