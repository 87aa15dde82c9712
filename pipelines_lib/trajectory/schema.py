"""THE trajectory schema: one Arrow row per trajectory, whole GRPO groups per shard.

Writer, reader, audit and tests import ``TRAJECTORY_SCHEMA`` and ``SCHEMA_VERSION`` from here and nowhere
else. Shards are Arrow IPC files readable by plain pyarrow / Polars; the schema's metadata carries
``rollstream.schema_version`` (``"<major>.<minor>"``) and the shard's provenance. A reader accepts any minor
version of its own major and refuses other majors with a clear error.

Token-level columns (``tokens``, ``loss_mask``, ``logprobs``, ``policy_version``) are lists of equal length:
position ``t`` describes ``tokens[t]``. Differences from ARCHITECTURE §3, and why:
- ``group_size`` is stored per row so a reader can check a shard holds whole groups without other state.
- ``worker_id`` is its own column (it is also the last part of ``trajectory_id``) so audits group by it cheaply.
- ``version`` (since 1.1) is the group's policy version, the oldest ``policy_version`` over the group's loss
  tokens: the number that names the shard's folder, as a scalar so SQL can ``GROUP BY version``. Readers derive
  it for 1.0 shards (``MINOR_ADDITIONS``).
- ``timings`` is a flat struct of seconds plus ISO-8601 UTC start/finish strings (not Arrow timestamps), so
  every reader sees the same value whatever its timezone handling.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1.2"
SCHEMA_MAJOR = int(SCHEMA_VERSION.split(".")[0])
SCHEMA_VERSION_KEY = b"rollstream.schema_version"
CAMPAIGN_KEY = b"rollstream.campaign"
"""Schema metadata (since 1.1): the campaign id, the name of the campaign folder the shard was written into."""

STATUSES = ("ok", "max_turns", "max_tokens", "tool_error", "env_error", "timeout", "engine_error", "infra_error")
"""``status`` values. ``ok``: the episode ended normally (reward may still be 0). The others say why it
stopped early or what failed; a failed sample still completes its group with the configured reward."""

INFRA_STATUSES = ("infra_error", "engine_error")
"""Statuses of infrastructure failures (a sandbox, a dependency, storage, the engine), not of the policy: a
group holding one is kept out of the loss (``trajectory.trainable.infra_problem``) instead of rewarded as a
failure. ``infra_error`` since schema 1.2."""

ROLES = ("system", "user", "assistant", "tool", "env")


def _field(name: str, type_: pa.DataType, doc: str, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={b"doc": doc.encode()})


TURN_TYPE = pa.struct(
    [
        pa.field("role", pa.string(), nullable=False),
        pa.field("start", pa.int32(), nullable=False),
        pa.field("end", pa.int32(), nullable=False),
        pa.field("tool_name", pa.string()),
        pa.field("latency_s", pa.float32()),
        pa.field("error", pa.string()),
    ]
)

TIMINGS_TYPE = pa.struct(
    [
        pa.field("queue_s", pa.float32(), nullable=False),
        pa.field("generate_s", pa.float32(), nullable=False),
        pa.field("env_s", pa.float32(), nullable=False),
        pa.field("reward_s", pa.float32(), nullable=False),
        pa.field("started_at", pa.string(), nullable=False),
        pa.field("finished_at", pa.string(), nullable=False),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        _field("trajectory_id", pa.string(), "<prompt_id>/<sample_idx>/<worker_id>; unique in a campaign"),
        _field("group_id", pa.string(), "GRPO group: the samples of one prompt drawn together"),
        _field("prompt_id", pa.string(), "dataset row the prompt came from"),
        _field("sample_idx", pa.int32(), "0..group_size-1 within the group"),
        _field("group_size", pa.int32(), "samples in the group; a shard holds every one of them"),
        _field("worker_id", pa.string(), "rollout worker that produced the trajectory"),
        _field("version", pa.int32(), "group's policy version: oldest policy_version over the group's loss tokens "
                                      "(0 if none); names the shard's folder"),
        _field("tokens", pa.list_(pa.int32()), "[T] exact ids the model saw and produced, prompt first"),
        _field("loss_mask", pa.list_(pa.int8()), "[T] 1 only on tokens the policy generated"),
        _field("logprobs", pa.list_(pa.float32()), "[T] engine logprob of each generated token, 0 elsewhere"),
        _field("policy_version", pa.list_(pa.int32()), "[T] weights version of each generated token, -1 elsewhere"),
        _field("prompt_len", pa.int32(), "tokens[:prompt_len] is the initial prompt"),
        _field("turns", pa.list_(TURN_TYPE), "segments [start, end) of tokens by role, in order"),
        _field("reward", pa.float32(), "final scalar reward"),
        _field("reward_parts", pa.map_(pa.string(), pa.float32()), "named components of the reward"),
        _field("status", pa.string(), f"one of {', '.join(STATUSES)}"),
        _field("timings", TIMINGS_TYPE, "seconds spent per phase, ISO-8601 UTC start and finish"),
        _field("env_name", pa.string(), "registered environment name"),
        _field("task_id", pa.string(), "task within the environment"),
        _field("tokenizer_hash", pa.string(), "hash of the tokenizer files the ids belong to"),
        _field("engine_info", pa.string(), "JSON: engine kind, slots, sampling parameters"),
        _field("status_reason", pa.string(), "what failed, for infrastructure failures (INFRA_STATUSES); else null",
               nullable=True),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

TOKEN_COLUMNS = ("tokens", "loss_mask", "logprobs", "policy_version")

MINOR_ADDITIONS: dict[str, int] = {"version": 1, "status_reason": 2}
"""Columns added by a minor version: name -> the minor that added it. A shard of an older minor lacks them and
its reader derives them (``trajectory.codec.decode_shard``)."""


class SchemaVersionError(ValueError):
    """A shard was written with a schema major version this code cannot read."""


def check_schema(schema: pa.Schema, where: str) -> str:
    """Return the schema version of ``schema`` or raise with ``where`` (a URL) in the message.

    Accepts any minor version of our major when every column of ``TRAJECTORY_SCHEMA`` is present with the
    same type (newer minors may add columns), except the columns added after the shard's own minor.
    """
    meta = schema.metadata or {}
    raw = meta.get(SCHEMA_VERSION_KEY)
    if raw is None:
        raise SchemaVersionError(f"{where}: not a rollstream shard (no {SCHEMA_VERSION_KEY.decode()} metadata)")
    try:
        version = raw.decode()
    except UnicodeDecodeError:
        raise SchemaVersionError(f"{where}: schema version metadata is not text ({raw[:20]!r})") from None
    try:
        major, minor = (int(x) for x in version.split("."))
    except ValueError:
        raise SchemaVersionError(f"{where}: unparseable schema version {version!r}") from None
    if major != SCHEMA_MAJOR:
        raise SchemaVersionError(
            f"{where}: schema version {version} is not readable by this rollstream "
            f"(reads {SCHEMA_MAJOR}.x); upgrade rollstream or re-export the shard"
        )
    if schema.equals(TRAJECTORY_SCHEMA):  # the common case in one call (metadata aside), before field by field
        return version
    for field in TRAJECTORY_SCHEMA:
        idx = schema.get_field_index(field.name)
        if idx < 0 and MINOR_ADDITIONS.get(field.name, 0) > minor:
            continue
        if idx < 0:
            raise SchemaVersionError(f"{where}: column {field.name!r} is missing (schema {version})")
        if not schema.field(idx).type.equals(field.type):
            raise SchemaVersionError(
                f"{where}: column {field.name!r} has type {schema.field(idx).type}, expected {field.type}"
            )
    return version
