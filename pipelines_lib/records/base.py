"""The record mechanism every campaign record shares: a frozen dataclass that knows its path, writes itself
once and reads itself back checked.

``_Record`` turns fields into JSON and back, checking each value against its annotation (nested parts, such
as the groups of a consumption log, are ``_Record`` too). ``Record`` is a whole campaign object: it carries
``record_version`` (a reader refuses versions it does not know; ``OLDER_VERSIONS`` lists the older ones it still
reads), names its path (``PATH`` for an object the folder holds once, ``KEY`` fields and ``path_of`` for one of
many) and has the only writer (``write``, create-only) and reader (``read``/``at``/``from_json``) of that object.
Errors are ``RecordError``, naming the object and the field. The per-area modules beside this one declare the
records; ``pipelines_lib.records`` exports them all.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, get_type_hints

from pipelines_lib.storage.errors import MAX_JSON_BYTES, TooLargeError, json_problem
from pipelines_lib.storage.store import Store


class RecordError(ValueError):
    """A campaign object that does not parse as the record it should be."""


RECORD_VERSION_KEY = "record_version"
MAX_DEPTH = 64
"""Deepest nesting of objects and lists a record may hold: a campaign writes a few levels, and building or
printing one nested thousands deep would exhaust the interpreter's stack."""


def depth_problem(raw: Any, limit: int = MAX_DEPTH) -> str | None:
    """Why parsed JSON ``raw`` is nested too deeply to read (None: it is not), found without recursion."""
    level = [raw]
    for _ in range(limit + 1):
        containers = [x for x in level if isinstance(x, dict | list)]
        if not containers:
            return None
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return f"nested deeper than {limit} levels"


def _check(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against annotation ``tp`` (nested records are built); raises ``RecordError``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (types.UnionType, typing.Union):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _check(value, option, where)
            except RecordError as e:
                errors.append(str(e))
        raise RecordError(errors[-1])
    if tp is type(None):
        if value is not None:
            raise RecordError(f"{where}: expected null, got {value!r}")
        return None
    if isinstance(tp, type) and issubclass(tp, _Record):
        return tp._from_mapping(value, where)
    if origin is list or origin is tuple:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)[:1]
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {k: _check(v, item, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise RecordError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _to_plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class _Record:
    """Fields → JSON and back, with checking. Nested parts (groups of a log) are ``_Record`` too."""

    @classmethod
    def _from_mapping(cls, raw: Any, where: str) -> Self:
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where}: expected a JSON object for a {cls.__name__}, got {type(raw).__name__}")
        hints = get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{where}: {cls.__name__} has no field {f.name!r}")
                continue
            kwargs[f.name] = _check(raw[f.name], hints[f.name], f"{where}: {cls.__name__}.{f.name}")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


@dataclass(frozen=True, kw_only=True)
class Record(_Record):
    """A whole campaign object: versioned, with one path."""

    VERSION: ClassVar[int] = 1
    """The version this code writes."""
    OLDER_VERSIONS: ClassVar[tuple[int, ...]] = ()
    """Earlier versions it still reads: their fields are a subset of this version's (the rest take defaults)."""

    @classmethod
    def from_json(cls, raw: Any, *, where: str) -> Self:
        """The record in parsed JSON ``raw`` read from ``where`` (a URL, for the error message)."""
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where}: expected a JSON object for a {cls.__name__}, got {type(raw).__name__}")
        version = raw.get(RECORD_VERSION_KEY)
        if isinstance(version, bool) or version not in (cls.VERSION, *cls.OLDER_VERSIONS):
            supported = " or ".join(str(v) for v in (*cls.OLDER_VERSIONS, cls.VERSION))
            raise RecordError(f"{where}: {cls.__name__} {RECORD_VERSION_KEY} {version!r} is not the supported "
                              f"{supported}")
        return cls._from_mapping({k: v for k, v in raw.items() if k != RECORD_VERSION_KEY}, where)

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str) -> Self:
        """The record in an object's raw bytes (for readers that fetch many objects at once, like the audit)."""
        if len(data) > MAX_JSON_BYTES:
            raise RecordError(f"{where}: {len(data)} bytes, larger than a {cls.__name__} may be ({MAX_JSON_BYTES})")
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise RecordError(f"{where}: not valid JSON for a {cls.__name__}: {json_problem(e)}") from None
        if (problem := depth_problem(raw)) is not None:
            raise RecordError(f"{where}: not a {cls.__name__}: {problem}")
        return cls.from_json(raw, where=where)

    def to_json(self) -> dict[str, Any]:
        return {RECORD_VERSION_KEY: self.VERSION, **self.to_dict()}

    PATH: ClassVar[str | None] = None
    """The path of a record the folder holds once; one of which it holds many names its path by ``KEY``."""
    KEY: ClassVar[tuple[str, ...]] = ()
    """The fields that name one object among many (``("step",)``), in the order ``path_of`` takes them."""

    @classmethod
    def path_of(cls, *key: Any) -> str:
        """Where the object named by ``key`` (values of the ``KEY`` fields) lives; a keyed record overrides this
        with its ``layout`` function."""
        if cls.PATH is None or key:
            raise TypeError(f"{cls.__name__}.path_of takes {cls.KEY or 'no key'}, got {key!r}")
        return cls.PATH

    def write(self, store: Store) -> str:
        """Create the object at its path (create-only: a second writer gets ``AlreadyExistsError``); returns it."""
        rel = self.path_of(*(getattr(self, name) for name in self.KEY))
        self._create(store, rel)
        return rel

    @classmethod
    def read(cls, store: Store, *key: Any) -> Self:
        return cls.at(store, cls.path_of(*key))

    @classmethod
    def exists(cls, store: Store, *key: Any) -> bool:
        return store.exists(cls.path_of(*key))

    @classmethod
    def at(cls, store: Store, rel: str) -> Self:
        """The record at ``rel``: a path its writer returned or a listing found (audits, run records)."""
        try:
            data = store.read(rel, max_bytes=MAX_JSON_BYTES)
        except TooLargeError as e:
            raise RecordError(str(e)) from None
        return cls.from_bytes(data, where=store.uri(rel))  # bytes that are no such record: RecordError

    def _create(self, store: Store, rel: str) -> None:
        store.create_json(rel, self.to_json())
