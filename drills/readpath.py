"""What the stream reads back, it checks: bounded shard reads and checked replays, through the real trainer.

Two catalogues, each case on real parts (the tiny decoder, a real campaign folder, Orbax checkpoints):

- ``BOUNDS`` (``run_bound_case``): a shard that one read bound refuses (``trajectory.needs.ShardLimits``,
  ``MAX_METADATA_DEPTH``, the membership check against the rows present) planted beside valid shards, and a fresh
  one again before each of two restarts (the trainer runs 1, then 2, then 3 steps). The case holds when every
  run returned, the trainer finished, every planted shard is named in a consumption log's ``skipped`` entry with
  the bound in its reason, every valid group was trained once, and the audit, the export and the SQL scan each
  name every planted shard and still read the valid ones. Anything else counts in ``readpath_crashes``.
- ``REPLAYS`` (``run_replay_case``): a trained campaign whose step 3 is logged after the step-2 checkpoint, then
  damaged: the shard step 3 consumed rewritten with a token id of 2^31-1 (``rewritten_consumed_shard``), the same
  under a log that records no digests (``rewritten_shard_undigested_log``), or a learning rate that makes step 2
  diverge (``diverging_step``). A restart must refuse naming the step (and the shard), publish nothing more, and
  no published version may hold non-finite parameters or come from a step with a non-finite loss or gradient
  norm (``nonfinite_publications``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from drills.poison import (
    GOOD_GROUPS,
    POISON_WORKER,
    CaseOutcome,
    Poison,
    _group,
    _shard,
    seed_poison_campaign,
)
from pipelines_lib import records
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

SPARSE_BYTES = 6 * 2**30
"""Apparent size of the oversize shard: a sparse file, so it costs the disk nothing and a whole read 6 GiB."""
DEEP = 100_000
"""Nesting of the deep provenance document (``json.loads`` recurses once a level)."""
ROWS = 20_000
"""Rows of the one-group shard over the row bound."""


def _deep_metadata(store: Store, seq: int) -> str:
    table = _group(f"deep{seq}")
    meta = {**(table.schema.metadata or {}), b"rollstream.shard": b"[" * DEEP + b"]" * DEEP}
    table = table.replace_schema_metadata(meta)
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(table)
    path = layout.shard_path(0, POISON_WORKER, seq)
    store.create(path, sink.getvalue())
    return path


def _huge_group_size(store: Store, seq: int) -> str:
    table = _group(f"gsize{seq}")
    table = table.set_column(table.schema.get_field_index("group_size"), "group_size",
                             pa.array([2**31 - 1] * table.num_rows, pa.int32()))
    return _shard(store, table, worker=POISON_WORKER, seq=seq)


def _sparse_file(store: Store, seq: int) -> str:
    path = layout.shard_path(0, POISON_WORKER, seq)
    local = store.local_path(path)
    assert local is not None
    with open(local, "wb") as f:
        f.truncate(SPARSE_BYTES)
    return path


def _too_many_rows(store: Store, seq: int) -> str:
    return _shard(store, _group(f"rows{seq}", size=ROWS), worker=POISON_WORKER, seq=seq)


@dataclass(frozen=True, kw_only=True)
class Bound:
    name: str
    plant: Callable[[Store, int], str]
    """``(store, seq) -> path`` of a poisoned shard of worker ``POISON_WORKER`` in v0."""
    reason: str
    """What every reader's reason for it must say."""


BOUNDS = [
    Bound(name="metadata_nested_100000_deep", plant=_deep_metadata, reason="nested"),
    Bound(name="group_size_2_31_minus_1", plant=_huge_group_size, reason="incomplete_group"),
    Bound(name="sparse_6_gib_file", plant=_sparse_file, reason="bytes"),
    Bound(name="group_of_20000_rows", plant=_too_many_rows, reason="rows, over the limit"),
]


def _named(path: str, reason: str, entries: list[tuple[str, str]], reader: str) -> list[str]:
    """Problems unless ``entries`` (``(path or URL, why)``) name ``path`` with ``reason`` in the why."""
    if any(p.endswith(path) and reason in why for p, why in entries):
        return []
    return [f"{reader} does not name {path} with {reason!r} (it names {[(p[-40:], w[:120]) for p, w in entries]})"]


def check_readers(store: Store, planted: list[str], reason: str, scratch: Path) -> list[str]:
    """Problems of the audit, the export and the SQL scan over a campaign holding ``planted`` poisoned shards."""
    from pipelines_lib.audit import audit_campaign
    from pipelines_lib.audit.export import export_parquet
    from pipelines_lib.audit.sql import scan_trajectories

    problems = []
    report = audit_campaign(store)
    found = [(b.path, b.reason) for b in report.bad_files] + [(f.path, f"{f.kind}: {f.message}")
                                                               for f in report.violations]
    problems += [p for path in planted for p in _named(path, reason, found, "audit")]
    if report.trajectories < GOOD_GROUPS * 4:
        problems.append(f"audit read {report.trajectories} trajectories, the valid shards hold {GOOD_GROUPS * 4}")
    exported = export_parquet(store, Store(str(scratch / "export")))
    skipped = [s for v in exported for s in v.skipped]
    problems += [p for path in planted for p in _named(path, reason, skipped, "export")]
    if (rows := sum(v.rows for v in exported)) != GOOD_GROUPS * 4:
        problems.append(f"export wrote {rows} rows, the valid shards hold {GOOD_GROUPS * 4}")
    scanned = scan_trajectories(store)
    problems += [p for path in planted for p in _named(path, reason, scanned.skipped, "sql scan")]
    if (rows := scanned.dataset.count_rows()) != GOOD_GROUPS * 4:
        problems.append(f"sql scan reads {rows} rows, the valid shards hold {GOOD_GROUPS * 4}")
    return problems


def run_bound_case(bound: Bound, root: Path) -> CaseOutcome:
    """``bound``'s poison through three trainer runs (a fresh copy before each), then the readers."""
    from pipelines_lib.stages.train import train

    t0 = time.perf_counter()
    problems: list[str] = []
    planted: list[str] = []

    def first(store: Store, good: list[str]) -> tuple[str, ...]:
        planted.append(bound.plant(store, 0))
        return ()

    try:
        store, config, _ = seed_poison_campaign(root, Poison(name=bound.name, plant=first, audit_kind=""))
        for run, steps in enumerate((1, 2, 3)):
            if run:
                planted.append(bound.plant(store, run))  # a fresh one, met after the restart
            train(store, config, max_steps=steps, log=lambda line: None)
        problems += check_trainer(store, planted, bound.reason)
        problems += check_readers(store, planted, bound.reason, root)
    except Exception as e:  # noqa: BLE001 - a crash is the outcome being measured
        problems.append(f"raised {type(e).__name__}: {str(e)[:300]}")
    return CaseOutcome(name=bound.name, ok=not problems, seconds=round(time.perf_counter() - t0, 2),
                       problems=tuple(problems))


def check_trainer(store: Store, planted: list[str], reason: str) -> list[str]:
    """Problems of a trainer run over ``planted`` poisoned shards: unfinished, a skip not logged, a group lost or
    trained twice."""
    problems = [] if store.exists(layout.TRAIN_DONE) else ["trainer did not finish"]
    logs = records.consumption_logs(store)
    skipped = [(s.shard, s.reason) for log in logs for s in log.skipped]
    problems += [p for path in planted for p in _named(path, reason, skipped, "the trainer's consumption logs")]
    trained = [g.group_id for log in logs for g in log.groups]
    if sorted(trained) != sorted(f"g{i}@w0" for i in range(GOOD_GROUPS)):
        problems.append(f"trained {sorted(trained)}, expected each of the {GOOD_GROUPS} valid groups once")
    return problems


# -- replays -------------------------------------------------------------------------------------------------

def _rewrite_consumed(store: Store, step: int, *, drop_digests: bool = False) -> str:
    """Rewrite (in place, as an attacker with the folder's permissions would) the shard ``step`` consumed: its first
    group's first token becomes 2^31-1. ``drop_digests``: the step's log loses its digests too (an older log)."""
    from pipelines_lib.trajectory.codec import encode_shard, read_shard

    g = records.ConsumptionLog.read(store, step).groups[0]
    table, provenance = read_shard(store, g.shard)
    rows = table.to_pylist()
    rows[g.row_start]["tokens"][0] = 2**31 - 1
    local = store.local_path(g.shard)
    assert local is not None
    local.write_bytes(encode_shard(pa.Table.from_pylist(rows, schema=table.schema), provenance))
    if drop_digests:
        entry = records.ConsumptionLog.read(store, step)
        older = dataclasses.replace(entry, groups=[dataclasses.replace(c, digest=None) for c in entry.groups])
        log_path = store.local_path(layout.consumed_log(step))
        assert log_path is not None
        log_path.write_text(json.dumps(older.to_json()))
    return g.shard


def nonfinite_publications(store: Store) -> list[str]:
    """Published versions whose step logged a non-finite loss or gradient norm, or whose parameters are not all
    finite."""
    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.model.weights import load_weights

    logs = {log.step: log for log in records.consumption_logs(store)}
    out = []
    for version in records.published_versions(store):
        if version == 0:
            continue
        step = next((s for s, log in logs.items() if log.published_version == version), None)
        metrics = logs[step].metrics if step is not None else {}
        if not all(math.isfinite(metrics.get(k, math.nan)) for k in ("loss", "grad_norm")):
            out.append(f"v{version}: step {step} metrics {metrics}")
        model = load_weights(store.uri(layout.weights_dir(version)))
        if not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state(model, nnx.Param))):
            out.append(f"v{version}: non-finite parameters")
    return out


@dataclass(frozen=True, kw_only=True)
class ReplayOutcome(CaseOutcome):
    nonfinite: tuple[str, ...] = ()


def run_replay_case(name: str, root: Path) -> ReplayOutcome:
    """Train to step 3 (step 3 logged after the step-2 checkpoint), damage the campaign (``name``), restart."""
    from harness.fixtures import seed_trainer_campaign, small_trainer_config
    from pipelines_lib.stages.train import train
    from pipelines_lib.train.reload import ReplayError
    from pipelines_lib.train.trainer import NonFiniteStepError

    t0 = time.perf_counter()
    problems: list[str] = []
    diverging = name == "diverging_step"
    config = small_trainer_config(4, publish_every=2, checkpoint_every=100)
    if diverging:  # Adam moves every weight by ~lr: step 2's forward pass overflows
        config = dataclasses.replace(config, trainer=dataclasses.replace(
            config.trainer, optim=dataclasses.replace(config.trainer.optim, lr=1e38, warmup_steps=0)))
    store = seed_trainer_campaign(str(root / "campaign"), config, n_groups=8)
    expected, shard = ("step 2", "") if diverging else ("step 3", "")
    refusal = ""
    try:
        if not diverging:
            train(store, config, max_steps=3, log=lambda line: None)
            shard = _rewrite_consumed(store, 3, drop_digests=name == "rewritten_shard_undigested_log")
        train(store, config, log=lambda line: None)
        problems.append("the restarted trainer did not refuse")
    except (ReplayError, NonFiniteStepError) as e:
        refusal = str(e)
        if expected not in str(e) or shard not in str(e):
            problems.append(f"refusal does not name {expected} and {shard or 'the step'}: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001 - measured
        problems.append(f"raised {type(e).__name__}: {str(e)[:300]}")
    latest = records.Publication.latest(store)
    last_good = 0 if diverging else 1  # step 2 publishes v1: unless it is the step that diverged
    if latest is None or latest.version != last_good:
        problems.append(f"published up to {latest}, expected v{last_good} and nothing after the refusal")
    nonfinite = tuple(nonfinite_publications(store))
    return ReplayOutcome(name=name, ok=not problems and not nonfinite, seconds=round(time.perf_counter() - t0, 2),
                         problems=tuple(problems + list(nonfinite)), detail=refusal[:300], nonfinite=nonfinite)


REPLAYS = ("rewritten_consumed_shard", "rewritten_shard_undigested_log", "diverging_step")


@dataclass(frozen=True, kw_only=True)
class ReadpathReport:
    bounds: list[CaseOutcome]
    replays: list[ReplayOutcome]

    def figures(self) -> dict[str, float]:
        cases = [*self.bounds, *self.replays]
        return {"reliability.readpath_cases": float(len(cases)),
                "reliability.readpath_crashes": float(sum(not c.ok for c in cases)),
                "reliability.nonfinite_publications": float(sum(len(r.nonfinite) for r in self.replays))}


def run_readpath_drill(scratch: Path, progress: Callable[[str], None] = print) -> ReadpathReport:
    bounds, replays = [], []
    for bound in BOUNDS:
        (scratch / bound.name).mkdir(parents=True)
        bounds.append(run_bound_case(bound, scratch / bound.name))
        progress(f"readpath {bound.name}: {'ok' if bounds[-1].ok else '; '.join(bounds[-1].problems)}")
    for name in REPLAYS:
        (scratch / name).mkdir(parents=True)
        replays.append(run_replay_case(name, scratch / name))
        progress(f"readpath {name}: {'ok' if replays[-1].ok else '; '.join(replays[-1].problems)}")
    return ReadpathReport(bounds=bounds, replays=replays)


__all__ = ["BOUNDS", "REPLAYS", "ReadpathReport", "check_readers", "nonfinite_publications", "run_bound_case",
           "run_readpath_drill", "run_replay_case"]
