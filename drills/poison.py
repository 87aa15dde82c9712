"""Poisoned data and junk metadata: shards that pass validation but cannot be trained on, bad pointer entries,
garbage names, and FIFOs named like campaign objects.

Four catalogues, each case on real parts:

- ``POISON`` (``run_poison``): a real campaign folder (tiny decoder, published v0, valid shards) plus one
  poisoned shard; the real trainer runs to its last step. A case passes when the trainer finished, every
  poisoned group is named in a consumption log's ``skipped`` entry with a reason (or, for a copy, the
  original is trained once and the copy skipped), no group id was trained twice, and the audit reports the
  poison. Anything else (a raise, a poisoned group trained, a silent loss) is a crash:
  ``reliability.trainer_poison_crashes``.
- ``POINTERS`` (``run_pointer_cases``): junk entries beside a pointer at v2. A regression is LATEST read as
  anything but v2, an ``advance_pointer`` to v3 that does not take, or an audit that does not report the
  entry: ``reliability.pointer_regressions``.
- ``METADATA`` (``run_cli_cases``): ``rollstream status/trace/metrics/export/audit`` as real subprocesses
  over garbage names, a truncated telemetry line, a foreign file in the export folder, and folders that are
  no campaign. Each must exit with its documented code and no traceback: ``reliability.cli_tracebacks``.
- ``FIFOS`` (``run_fifo_cases``): FIFOs (and a character device where the machine allows ``mknod``) named
  like a shard, a pointer entry or a telemetry file; audit, export, status and the tailer run as subprocesses
  under a deadline. A case still running at its deadline is killed and counted: ``reliability.hangs``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines_lib import records
from pipelines_lib.records import CampaignManifest, Publication
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import encode_shard
from pipelines_lib.trajectory.record import to_table
from pipelines_lib.trajectory.schema import SCHEMA_VERSION, TRAJECTORY_SCHEMA
from pipelines_lib.trajectory.synthetic import synthetic_group
from pipelines_lib.utc import utc_now_iso

ROOT = Path(__file__).resolve().parents[1]
CLI_DEADLINE_S = 120.0
"""Per subprocess: generous for a loaded machine (imports alone take seconds); a hang never ends."""
GOOD_GROUPS = 6
"""Valid groups in every poison campaign, two per shard: v0 holds four, v1 two; three trainer steps of two.
Poisoned shards are named to sort before the good ones (worker ``a9``), so the trainer meets them before it
can finish."""
POISON_WORKER = "a9"


def _drill_manifest(store: Store) -> None:
    """A ``campaign.json`` that records no config (the audit then skips the trainer's checks)."""
    CampaignManifest(kind="drill", schema_version=SCHEMA_VERSION, code_version="drill", created_at=utc_now_iso(),
                     config={}).write(store)


def _publication(version: int) -> Publication:
    return Publication(version=version, path=layout.weights_dir(version), step=version, published_at=utc_now_iso())


def _config():  # noqa: ANN202 - CampaignConfig, imported lazily with the trainer's stack
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.model.config import ModelConfig

    base = CampaignConfig.tiny()
    model = dataclasses.replace(ModelConfig.tiny(), n_layers=1, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32,
                                d_ff=128)
    return dataclasses.replace(
        base, model=model, rollout=dataclasses.replace(base.rollout, eta=100),
        trainer=dataclasses.replace(base.trainer, batch_groups=2, max_steps=3, publish_every=1, checkpoint_every=3,
                                    skip_zero_advantage=False, poll_s=0.05, data_timeout_s=10))


def _group(pid: str, *, size: int = 4, version: int = 0, worker: str = "w0") -> pa.Table:
    return to_table(synthetic_group(prompt_id=pid, group_size=size, worker_id=worker, policy_version=version,
                                    seed=1, vocab_size=256, max_len=60))


def _shard(store: Store, table: pa.Table, *, worker: str, seq: int, version: int = 0) -> str:
    path = layout.shard_path(version, worker, seq)
    store.create(path, encode_shard(table, {"worker_id": worker, "seq": seq, "version": version}))
    return path


def _rows(table: pa.Table, edit: Callable[[list[dict]], None]) -> pa.Table:
    rows = table.to_pylist()
    edit(rows)
    return pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)


def _lengthen(rows: list[dict], extra: int) -> None:
    """Append ``extra`` non-policy tokens to row 0 (still valid: a longer last turn)."""
    r = rows[0]
    r["tokens"] += [1] * extra
    r["loss_mask"] += [0] * extra
    r["logprobs"] += [0.0] * extra
    r["policy_version"] += [-1] * extra
    r["turns"][-1]["end"] = len(r["tokens"])


def _huge_row(table: pa.Table, n_tokens: int) -> pa.Table:
    """Row 0 with ``n_tokens`` zero tokens, built from numpy (Python lists of that size cost gigabytes)."""
    lengths = [n_tokens] + [len(t) for t in table.column("tokens").to_pylist()[1:]]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def column(name: str, dtype: type, fill: float) -> pa.Array:
        rest = [np.asarray(v, dtype) for v in table.column(name).to_pylist()[1:]]
        values = np.concatenate([np.full(n_tokens, fill, dtype)] + rest)
        return pa.ListArray.from_arrays(offsets, pa.array(values)).cast(TRAJECTORY_SCHEMA.field(name).type)

    out = table
    for name, dtype, fill in (("tokens", np.int32, 0), ("loss_mask", np.int8, 0), ("logprobs", np.float32, 0.0),
                              ("policy_version", np.int32, -1)):
        out = out.set_column(out.schema.get_field_index(name), name, column(name, dtype, fill))
    turns = out.column("turns").to_pylist()
    turns[0][-1]["end"] = n_tokens
    return out.set_column(out.schema.get_field_index("turns"), "turns",
                          pa.array(turns, TRAJECTORY_SCHEMA.field("turns").type))


@dataclass(frozen=True, kw_only=True)
class Poison:
    name: str
    plant: Callable[[Store, list[str]], tuple[str, ...]]
    """``(store, good shard paths) -> group ids that must end up skipped`` (written after the good shards)."""
    audit_kind: str
    """The finding kind (or bad-file kind) the audit must report."""


def _plant_wrong_size(store: Store, good: list[str]) -> tuple[str, ...]:
    _shard(store, _group("small", size=3), worker=POISON_WORKER, seq=0)
    return ("small@w0",)


def _plant_long_row(store: Store, good: list[str]) -> tuple[str, ...]:
    _shard(store, _rows(_group("long"), lambda rows: _lengthen(rows, 400)), worker=POISON_WORKER, seq=0)
    return ("long@w0",)


def _plant_huge_row(store: Store, good: list[str]) -> tuple[str, ...]:
    _shard(store, _huge_row(_group("huge"), 20_000_000), worker=POISON_WORKER, seq=0)
    return ()  # refused before decoding: its group ids are never read


def _plant_out_of_vocab(store: Store, good: list[str]) -> tuple[str, ...]:
    def edit(rows: list[dict]) -> None:
        rows[0]["tokens"][0] = 10**6

    _shard(store, _rows(_group("vocab"), edit), worker=POISON_WORKER, seq=0)
    return ("vocab@w0",)


def _plant_negative_token(store: Store, good: list[str]) -> tuple[str, ...]:
    def edit(rows: list[dict]) -> None:
        rows[1]["tokens"][3] = -7

    _shard(store, _rows(_group("negative"), edit), worker=POISON_WORKER, seq=0)
    return ("negative@w0",)


def _plant_absurd_reward(store: Store, good: list[str]) -> tuple[str, ...]:
    def edit(rows: list[dict]) -> None:
        rows[2]["reward"] = 3e38  # finite, so valid; its square is not a float32

    _shard(store, _rows(_group("reward"), edit), worker=POISON_WORKER, seq=0)
    return ("reward@w0",)


def _plant_future_version(store: Store, good: list[str]) -> tuple[str, ...]:
    def edit(rows: list[dict]) -> None:
        r = rows[0]
        last = max(i for i, m in enumerate(r["loss_mask"]) if m)
        r["policy_version"][last] = 50

    _shard(store, _rows(_group("future"), edit), worker=POISON_WORKER, seq=0)
    return ("future@w0",)


def _plant_interleaved(store: Store, good: list[str]) -> tuple[str, ...]:
    a, b = _group("ia"), _group("ib")
    order = [i // 2 + (a.num_rows if i % 2 else 0) for i in range(2 * a.num_rows)]
    _shard(store, pa.concat_tables([a, b]).take(order), worker=POISON_WORKER, seq=0)
    return ("ia@w0", "ib@w0")


def _plant_copy(store: Store, good: list[str]) -> tuple[str, ...]:
    store.create(layout.shard_path(0, "a0", 0), store.read(good[0]))
    return ()  # the original's groups are trained once; the copy is skipped


def _plant_copy_other_version(store: Store, good: list[str]) -> tuple[str, ...]:
    src = layout.parse_shard_path(good[0])
    assert src is not None
    store.create(layout.shard_path(1, src.worker_id, src.seq), store.read(good[0]))
    return ()


def _plant_reencoded_copy(store: Store, good: list[str]) -> tuple[str, ...]:
    from pipelines_lib.trajectory.codec import read_shard

    table, _ = read_shard(store, good[0])
    _shard(store, table, worker=POISON_WORKER, seq=0)  # same groups, provenance forged to match its new name
    return ()


def _plant_fifo(store: Store, good: list[str]) -> tuple[str, ...]:
    path = store.local_path(layout.shard_path(0, POISON_WORKER, 0))
    assert path is not None
    os.mkfifo(path)
    return ()


def _plant_symlink_out(store: Store, good: list[str]) -> tuple[str, ...]:
    path = store.local_path(layout.shard_path(0, POISON_WORKER, 0))
    outside = store.local_path("").parent / "outside.arrow"  # type: ignore[union-attr]
    outside.write_bytes(store.read(good[0]))
    assert path is not None
    path.symlink_to(outside)
    return ()


POISON = [
    Poison(name="group_size_differs", plant=_plant_wrong_size, audit_kind="untrainable_group"),
    Poison(name="row_over_largest_bucket", plant=_plant_long_row, audit_kind="untrainable_group"),
    Poison(name="huge_declared_row_small_file", plant=_plant_huge_row, audit_kind="oversized"),
    Poison(name="token_id_outside_vocabulary", plant=_plant_out_of_vocab, audit_kind="untrainable_group"),
    Poison(name="token_id_negative", plant=_plant_negative_token, audit_kind="untrainable_group"),
    Poison(name="reward_absurd", plant=_plant_absurd_reward, audit_kind="untrainable_group"),
    Poison(name="policy_version_never_published", plant=_plant_future_version, audit_kind="untrainable_group"),
    Poison(name="interleaved_groups", plant=_plant_interleaved, audit_kind="interleaved_groups"),
    Poison(name="copied_shard_same_folder", plant=_plant_copy, audit_kind="copied_shard"),
    Poison(name="copied_shard_other_version", plant=_plant_copy_other_version, audit_kind="copied_shard"),
    Poison(name="reencoded_copy", plant=_plant_reencoded_copy, audit_kind="duplicate_trajectory"),
    Poison(name="fifo_named_like_a_shard", plant=_plant_fifo, audit_kind="not_a_file"),
    Poison(name="symlink_out_of_the_campaign", plant=_plant_symlink_out, audit_kind="not_a_file"),
]


@dataclass(frozen=True, kw_only=True)
class CaseOutcome:
    name: str
    ok: bool
    seconds: float
    problems: tuple[str, ...] = ()
    detail: str = ""


def seed_poison_campaign(root: Path, case: Poison, *, publish: bool = True) -> tuple[Store, object, tuple[str, ...]]:
    """A campaign at ``root`` with published v0 (unless ``publish`` is False: tailer-only tests), ``GOOD_GROUPS``
    valid groups, then ``case``'s poison. Returns the store, the config and the group ids that must be skipped."""
    from pipelines_lib.stages.campaign import init_campaign

    config = _config()
    store = Store(str(root / "campaign"))
    init_campaign(store, config)
    if publish:
        from flax import nnx

        from pipelines_lib.model.decoder import Decoder
        from pipelines_lib.publish import publish_weights

        publish_weights(store, Decoder(config.model, rngs=nnx.Rngs(0)), version=0, step=0)
    good = [_shard(store, pa.concat_tables([_group(f"g{2 * i}", version=i // 2), _group(f"g{2 * i + 1}", version=i // 2)]),
                   worker="w0", seq=i, version=i // 2) for i in range(GOOD_GROUPS // 2)]
    return store, config, case.plant(store, good)


def check_poison_run(store: Store, poisoned: tuple[str, ...], audit_kind: str) -> list[str]:
    """What went wrong after the trainer ran on a poisoned campaign (empty: nothing)."""
    from pipelines_lib.audit import audit_campaign

    problems = []
    if not store.exists(layout.TRAIN_DONE):
        problems.append("trainer did not finish")
    trained: list[str] = []
    skipped: set[str] = set()
    reasons: list[str] = []
    for log in records.consumption_logs(store):
        trained += [g.group_id for g in log.groups]
        for s in log.skipped:
            skipped.update(s.groups)
            reasons.append(s.reason)
    if len(trained) != len(set(trained)):
        problems.append(f"groups trained twice: {sorted(g for g in set(trained) if trained.count(g) > 1)}")
    if set(poisoned) & set(trained):
        problems.append(f"poisoned groups trained: {sorted(set(poisoned) & set(trained))}")
    if set(poisoned) - skipped:
        problems.append(f"poisoned groups neither trained nor skipped with a reason: {sorted(set(poisoned) - skipped)}")
    if not reasons:
        problems.append("no skip recorded in any consumption log")
    report = audit_campaign(store)
    kinds = set(report.violation_counts) | {b.kind for b in report.bad_files}
    if audit_kind not in kinds:
        problems.append(f"audit does not report {audit_kind} (it reports {sorted(kinds)})")
    return problems


def run_poison_case(case: Poison, root: Path) -> CaseOutcome:
    from pipelines_lib.stages.train import train

    t0 = time.perf_counter()
    try:
        store, config, poisoned = seed_poison_campaign(root, case)
        train(store, config, log=lambda line: None)
        problems = check_poison_run(store, poisoned, case.audit_kind)
    except Exception as e:  # noqa: BLE001 - a crash is the outcome being measured
        problems = [f"raised {type(e).__name__}: {str(e)[:300]}"]
    return CaseOutcome(name=case.name, ok=not problems, seconds=round(time.perf_counter() - t0, 2),
                       problems=tuple(problems))


def run_poison(scratch: Path, progress: Callable[[str], None] = print) -> list[CaseOutcome]:
    out = []
    for case in POISON:
        root = scratch / case.name
        root.mkdir(parents=True)
        out.append(run_poison_case(case, root))
        progress(f"poison {case.name}: {'ok' if out[-1].ok else '; '.join(out[-1].problems)}")
        shutil.rmtree(root, ignore_errors=True)
    return out


# -- pointers ----------------------------------------------------------------------------------------------

POINTER_JUNK: dict[str, Callable[[Path], None]] = {
    "named_latest": lambda d: (d / "latest.json").write_text('{"version": 1, "step": 1}'),
    "named_zzz": lambda d: (d / "zzz.json").write_text('{"version": 1, "step": 1}'),
    "name_disagrees_with_version": lambda d: (d / f"{9:012d}.json").write_text('{"version": 1, "step": 1}'),
    "negative_version": lambda d: (d / f"{8:012d}.json").write_text('{"version": -8, "step": 1}'),
    "not_json": lambda d: (d / f"{7:012d}.json").write_text('{"version": 7'),
    "not_an_object": lambda d: (d / f"{6:012d}.json").write_text("[6]"),
    "version_is_a_string": lambda d: (d / f"{5:012d}.json").write_text('{"version": "5", "step": 1}'),
    "fifo_entry": lambda d: os.mkfifo(d / f"{4:012d}.json"),
    "symlink_out": lambda d: (d / f"{3:012d}.json").symlink_to(d.parents[2] / "outside.json"),
}


def run_pointer_case(name: str, root: Path) -> CaseOutcome:
    from pipelines_lib.audit import audit_campaign

    t0 = time.perf_counter()
    store = Store(str(root / "campaign"))
    _drill_manifest(store)
    (root / "outside.json").write_text('{"version": 3, "step": 1}')
    for v in range(3):
        _publication(v).advance(store)
    entries = store.local_path(f"{layout.WEIGHTS_LATEST}.d")
    assert entries is not None
    POINTER_JUNK[name](entries)
    problems = []
    try:
        latest = Publication.latest(store)
        if latest is None or latest.version != 2:
            problems.append(f"LATEST read as {latest} with a junk entry beside v2")
        if not _publication(3).advance(store) and name != "symlink_out":
            problems.append("advance_pointer to v3 did not take")
        latest = Publication.latest(store)
        expected = 2 if name == "symlink_out" else 3  # that junk entry holds v3's name: v3 cannot be created
        if latest is None or latest.version != expected:
            problems.append(f"LATEST read as {latest} after advancing, expected v{expected}")
        report = audit_campaign(store)
        if "bad_pointer_entry" not in report.violation_counts:
            problems.append(f"audit does not report the entry (violations {report.violation_counts})")
    except Exception as e:  # noqa: BLE001 - measured
        problems.append(f"raised {type(e).__name__}: {str(e)[:300]}")
    return CaseOutcome(name=name, ok=not problems, seconds=round(time.perf_counter() - t0, 2),
                       problems=tuple(problems))


def run_pointer_cases(scratch: Path) -> list[CaseOutcome]:
    out = []
    for name in POINTER_JUNK:
        (scratch / name).mkdir(parents=True)
        out.append(run_pointer_case(name, scratch / name))
    return out


# -- CLI over garbage metadata, and FIFOs under a deadline ----------------------------------------------------

def _cli(args: list[str], deadline_s: float = CLI_DEADLINE_S, **env_vars: str) -> tuple[int | None, str]:
    """(exit code or None when killed at the deadline, stderr+stdout) of ``rollstream ARGS``, with ``env_vars``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **env_vars}
    try:
        proc = subprocess.run([sys.executable, "-m", "pipelines_lib.cli", *args], capture_output=True, text=True,
                              timeout=deadline_s, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return None, str(e.stderr or "")
    return proc.returncode, proc.stderr + proc.stdout


def garbage_campaign(root: Path) -> Path:
    """A minimal campaign (one valid shard) with garbage wherever a name or line is parsed."""
    store = Store(str(root / "campaign"))
    _drill_manifest(store)
    _shard(store, _group("p0"), worker="w0", seq=0)
    _publication(0).advance(store)
    c = root / "campaign"
    for rel, text in (("eval/vXXXXXXXX.json", "{}"), ("eval/notes.json", "hello"), ("eval/v1.json", "{}"),
                      ("train/consumed/last.json", "{}"), ("train/consumed/0000001.json", "{"),
                      ("train/checkpoints/latest/COMMITTED", ""), ("train/checkpoints/00000001.x/COMMITTED", ""),
                      ("weights/LATEST.json.d/latest.json", '{"version": 9}'),
                      ("telemetry/trainer-x-00000.jsonl",
                       '{"type": "span", "name": "a", "process": "trainer", "track": "t", "ts_us": 1, "dur_us": 2}\n'
                       '{"type": "span", "name": "b", "proc'),
                      ("telemetry/odd-x-00000.jsonl", '[1, 2]\n{"type": "gauge"}\n\xff\xfe\n')):
        (c / rel).parent.mkdir(parents=True, exist_ok=True)
        (c / rel).write_text(text)
    (root / "export").mkdir()
    (root / "export" / "v00000000.parquet").write_text("not parquet at all")
    return c


METADATA: dict[str, tuple[Callable[[Path], list[str]], tuple[int, ...]]] = {
    "status_garbage_names": (lambda r: ["status", str(r / "campaign")], (0,)),
    "trace_truncated_telemetry": (lambda r: ["trace", str(r / "campaign"), "--out", str(r / "trace.json")], (0,)),
    "metrics_truncated_telemetry": (lambda r: ["metrics", str(r / "campaign")], (0,)),
    "export_garbage_in_output": (lambda r: ["export", str(r / "campaign"), str(r / "export")], (0,)),
    "audit_garbage_names": (lambda r: ["audit", str(r / "campaign")], (1,)),
    "audit_etc": (lambda r: ["audit", "file:///etc"], (2,)),
    "audit_empty_url": (lambda r: ["audit", ""], (2,)),
    "audit_folder_without_campaign_json": (lambda r: ["audit", str(r / "export")], (2,)),
}


def _cli_outcome(name: str, args: list[str], codes: tuple[int, ...], expect: str = "") -> CaseOutcome:
    t0 = time.perf_counter()
    rc, out = _cli(args)
    problems = []
    if rc is None:
        problems.append(f"still running after {CLI_DEADLINE_S:.0f} s (hang)")
    elif "Traceback (most recent call last)" in out:
        problems.append("printed a traceback")
    elif rc not in codes:
        problems.append(f"exit {rc}, expected {codes}")
    if rc is not None and expect and expect not in out:
        problems.append(f"output lacks {expect!r}")
    return CaseOutcome(name=name, ok=not problems, seconds=round(time.perf_counter() - t0, 2),
                       problems=tuple(problems), detail=out.strip().splitlines()[-1][:200] if out.strip() else "")


def run_cli_cases(scratch: Path, names: list[str] | None = None) -> list[CaseOutcome]:
    garbage_campaign(scratch)
    out = []
    for name, (args, codes) in METADATA.items():
        if names is None or name in names:
            expect = "not a campaign" if codes == (2,) else ""
            out.append(_cli_outcome(name, args(scratch), codes, expect))
    return out


def _device(path: Path) -> bool:
    """A character device (/dev/null's numbers) at ``path``; False where the machine refuses ``mknod``."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, OSError):
        return False
    return True


_TAIL = ("from pipelines_lib.storage.store import Store; from pipelines_lib.trajectory.folder import FolderChannel; "
         "from pipelines_lib.trajectory.window import Window; "
         "t = FolderChannel(Store({url!r})).reader(); g = t.next_groups(8, Window(version=0, eta=0)); "
         "print(len(g), 'groups;', [e.reason for e in t.drain_events()])")


def run_fifo_cases(scratch: Path) -> list[CaseOutcome]:
    """Readers over special files named like campaign objects, each as a subprocess under a deadline."""
    root = scratch / "fifo"
    store = Store(str(root / "campaign"))
    _drill_manifest(store)
    _shard(store, _group("p0"), worker="w0", seq=0)
    _publication(0).advance(store)
    c = root / "campaign"
    os.mkfifo(c / layout.shard_path(0, "fifo", 0))
    os.mkfifo(c / f"{layout.WEIGHTS_LATEST}.d" / f"{1:012d}.json")
    (c / "telemetry").mkdir()
    os.mkfifo(c / "telemetry" / "trainer-x-00000.jsonl")
    has_device = _device(c / layout.shard_path(0, "device", 0))
    url = str(c)
    cases = [
        ("audit", ["audit", url], (1,), "not a regular file"),
        ("export", ["export", url, str(root / "export")], (0,), ""),
        ("status", ["status", url], (0,), ""),
        ("metrics", ["metrics", url], (0,), "not a regular file"),
    ]
    out = [_cli_outcome(f"fifo_{name}" + ("_and_device" if has_device else ""), args, codes, expect)
           for name, args, codes, expect in cases]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _TAIL.format(url=url)], capture_output=True, text=True,
                              timeout=CLI_DEADLINE_S, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                              stdin=subprocess.DEVNULL)
        problems = [] if proc.returncode == 0 and proc.stdout.startswith("1 groups") else [
            f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"]
    except subprocess.TimeoutExpired:
        problems = [f"still running after {CLI_DEADLINE_S:.0f} s (hang)"]
    out.append(CaseOutcome(name="fifo_tailer" + ("_and_device" if has_device else ""), ok=not problems,
                           seconds=round(time.perf_counter() - t0, 2), problems=tuple(problems)))
    return out


@dataclass(frozen=True, kw_only=True)
class PoisonReport:
    poison: list[CaseOutcome] = field(default_factory=list)
    pointers: list[CaseOutcome] = field(default_factory=list)
    metadata: list[CaseOutcome] = field(default_factory=list)
    fifos: list[CaseOutcome] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        return {
            "reliability.trainer_poison_cases": float(len(self.poison)),
            "reliability.trainer_poison_crashes": float(sum(not o.ok for o in self.poison)),
            "reliability.pointer_cases": float(len(self.pointers)),
            "reliability.pointer_regressions": float(sum(not o.ok for o in self.pointers)),
            "reliability.cli_cases": float(len(self.metadata)),
            "reliability.cli_tracebacks": float(sum(not o.ok for o in self.metadata)),
            "reliability.hang_cases": float(len(self.fifos)),
            "reliability.hangs": float(sum(not o.ok for o in self.fifos)),
        }


def run_poison_drill(scratch: Path, progress: Callable[[str], None] = print) -> PoisonReport:
    pointers = run_pointer_cases(scratch / "pointers")
    progress(f"pointer cases: {sum(o.ok for o in pointers)}/{len(pointers)} held")
    (scratch / "cli").mkdir()
    metadata = run_cli_cases(scratch / "cli")
    progress(f"metadata CLI cases: {sum(o.ok for o in metadata)}/{len(metadata)} clean")
    fifos = run_fifo_cases(scratch)
    progress(f"FIFO cases: {sum(o.ok for o in fifos)}/{len(fifos)} ended in time")
    return PoisonReport(poison=run_poison(scratch / "poison", progress), pointers=pointers, metadata=metadata,
                        fifos=fifos)


__all__ = ["POINTER_JUNK", "POISON", "PoisonReport", "check_poison_run", "run_cli_cases", "run_fifo_cases",
           "run_pointer_case", "run_poison_case", "run_poison_drill", "seed_poison_campaign"]

