"""Benchmark ``scale``: the same training on device meshes and processes, and which model fits which slice.

```
mesh      one process, 8 fake CPU devices: the streaming trainer over one fixed campaign folder (copied per run)
          on meshes 1, fsdp=8 and data=2 × fsdp=2 × tensor=2; per-step losses and final parameters against the
          one-device run
fits      jax.eval_shape only (nothing allocated): parameter + Adam state + one micro-batch of activations per
          device for Qwen3-0.6B, Qwen3-8B, Llama-3-8B and Gemma-3-12B shapes, bf16, on 8/16/64/256 devices
          (FSDP over all of them), with the per-device parameter bytes the rules table gives
throughput  8 fake CPU devices: train steps of a ~20 M-parameter decoder on one device and on fsdp=8, and a
          profile of one fsdp=8 step (collectives' share of its HLO operation time)
campaign  (not a part: ``flows.campaign`` itself in an interpreter with 8 fake devices) the tiny preset end to
          end with trainer.mesh.fsdp=4 and engine.mesh.tensor=2, and without them
```

Each part runs in its own interpreter (``python -m bench.scale PART ARGS_JSON`` prints one JSON line): XLA reads
the fake device count only when JAX starts. ``tests/test_mesh.py`` runs the ``mesh`` part as its test, and the
smoke and tiny presets' campaigns on ``CAMPAIGN_MESH`` end to end (both marked slow: this benchmark's ``campaign``
runs the tiny one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.learning import run_campaign
from bench.registry import BenchContext, BenchResult, Goal, register_bench

ROOT = Path(__file__).resolve().parents[1]
MESHES: dict[str, dict[str, int]] = {
    "1": {},
    "fsdp=8": {"fsdp": 8},
    "data=2×fsdp=2×tensor=2": {"data": 2, "fsdp": 2, "tensor": 2},
}
"""The meshes the ``mesh`` part trains on; the first is the reference."""
HBM_GIB = {"v5e": 16, "v5p": 95, "v6e": 32, "H100": 80}
"""Memory per chip of the slices the ``fits`` table is read against."""
SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {"vocab_size": 151936, "d_model": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8,
                   "head_dim": 128, "d_ff": 3072, "qk_norm": True, "tie_embeddings": True},
    "Qwen3-8B": {"vocab_size": 151936, "d_model": 4096, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8,
                 "head_dim": 128, "d_ff": 12288, "qk_norm": True},
    "Llama-3-8B": {"vocab_size": 128256, "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                   "head_dim": 128, "d_ff": 14336},
    "Gemma-3-12B": {"vocab_size": 262208, "d_model": 3840, "n_layers": 48, "n_heads": 16, "n_kv_heads": 8,
                    "head_dim": 256, "d_ff": 15360, "qk_norm": True, "post_norms": True, "tie_embeddings": True,
                    "norm": "gemma_rms", "activation": "gelu_tanh", "embed_scale": True},
}
"""``ModelConfig`` values of the public configs (their ``config.json``), architecture switches included."""
DEVICE_COUNTS = (8, 16, 64, 256)
MICRO_BATCH = {"rows_per_device": 1, "seq_len": 4096}
"""The activation term of ``fits``: one sequence of 4096 tokens per device, per-layer remat."""


def fake_devices_env(n_devices: int, *, fast_compile: bool = True) -> dict[str, str]:
    """Environment of an interpreter whose CPU backend has ``n_devices`` devices. ``fast_compile``: XLA's
    optimisation level 0, which roughly halves its CPU compile time (every run of a comparison uses the same
    level); runs that time their steps keep the default."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}"
    if fast_compile:
        flags += " --xla_backend_optimization_level=0"
    return os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags,
                         "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def run_part(part: str, args: dict[str, Any], *, n_devices: int, timeout_s: float = 900,
             fast_compile: bool = True) -> dict[str, Any]:
    """``PARTS[part](args)`` in a fresh interpreter with ``n_devices`` fake CPU devices; its JSON line."""
    done = subprocess.run([sys.executable, "-m", "bench.scale", part, json.dumps(args)], cwd=ROOT,
                          env=fake_devices_env(n_devices, fast_compile=fast_compile), capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"scale part {part!r} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mesh_campaign_config(steps: int):  # noqa: ANN201 - JAX-side imports stay in the part's interpreter
    """A small two-layer model whose heads, kv heads, MLP, vocabulary and width all split on 2 and 8 devices;
    2 groups of 4 per step (8 rows: one per device under fsdp=8), publications and checkpoints every 2 steps."""
    from pipelines_lib.config import CampaignConfig
    from pipelines_lib.model.config import ModelConfig

    base = CampaignConfig.tiny()
    model = dataclasses.replace(ModelConfig.tiny(), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16,
                                d_ff=128)
    return dataclasses.replace(base, model=model, trainer=dataclasses.replace(
        base.trainer, batch_groups=2, max_steps=steps, publish_every=2, checkpoint_every=2,
        skip_zero_advantage=False, data_timeout_s=5, poll_s=0.05))


def part_mesh(args: dict[str, Any]) -> dict[str, Any]:
    """Train ``args["steps"]`` steps on each mesh of ``MESHES`` from copies of one campaign folder."""
    import jax
    import numpy as np
    from flax import nnx

    from bench.trainer import write_shards
    from pipelines_lib.mesh import MeshConfig
    from pipelines_lib.stages.train import trainer_for
    from pipelines_lib.storage.store import Store

    root = Path(args["root"])
    config = mesh_campaign_config(args["steps"])
    write_shards(Store(str(root / "seed")), config, n_groups=2 * args["steps"] + 2)
    runs: dict[str, dict[str, Any]] = {}
    for name, axes in MESHES.items():
        folder = root / f"mesh-{len(runs)}"
        shutil.copytree(root / "seed", folder)
        run_config = dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, mesh=MeshConfig(**axes)))
        trainer = trainer_for(Store(str(folder)), run_config, log=lambda line: None)
        trainer.run()
        params = [np.asarray(p, np.float64) for p in jax.tree.leaves(nnx.state(trainer.model, nnx.Param))]
        embedding = trainer.model.embed.embedding[...]
        runs[name] = {"losses": [m["loss"] for m in trainer.metrics], "params": params,
                      "embed_spec": [str(a) for a in embedding.sharding.spec],
                      "embed_shard_shape": list(embedding.addressable_shards[0].data.shape)}
    reference = runs[next(iter(MESHES))]
    flat_ref = np.concatenate([p.ravel() for p in reference["params"]])
    out: dict[str, Any] = {"meshes": {}}
    for name, run in runs.items():
        flat = np.concatenate([p.ravel() for p in run["params"]])
        out["meshes"][name] = {
            "losses": run["losses"],
            "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(run["losses"], reference["losses"], strict=True)),
            "param_rel_diff": float(np.linalg.norm(flat - flat_ref) / np.linalg.norm(flat_ref)),
            "embed_spec": run["embed_spec"], "embed_shard_shape": run["embed_shard_shape"]}
    return out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def seed_multiprocess_campaign(folder: Path, *, steps: int, n_processes: int, mesh: dict[str, int]) -> str:
    """A campaign folder (config, shards, v0) whose trainer spans ``n_processes`` processes on 127.0.0.1."""
    from flax import nnx

    from bench.trainer import write_shards
    from pipelines_lib.distributed import DistributedConfig
    from pipelines_lib.mesh import MeshConfig
    from pipelines_lib.stages.campaign import init_campaign
    from pipelines_lib.storage.store import Store

    config = mesh_campaign_config(steps)
    config = dataclasses.replace(
        config, trainer=dataclasses.replace(config.trainer, mesh=MeshConfig(**mesh)),
        distributed=DistributedConfig(coordinator_address=f"127.0.0.1:{free_port()}", num_processes=n_processes,
                                      heartbeat_timeout_s=10))
    store = Store(str(folder))
    init_campaign(store, config)
    write_shards(store, config, n_groups=2 * steps + 2)
    del nnx
    return str(folder)


def launch_trainers(url: str, n_processes: int, devices_per_process: int, logs: Path) -> list[subprocess.Popen]:
    """``rollstream train URL --process-id i`` for every process of the campaign's group, each with
    ``devices_per_process`` fake CPU devices; stdout and stderr in ``logs/p<i>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n_processes):
        with open(logs / f"p{i}.log", "ab") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-u", "-m", "pipelines_lib.cli", "train", url, "--process-id", str(i)], cwd=ROOT,
                env=fake_devices_env(devices_per_process), stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait_all(procs: list[subprocess.Popen], logs: Path, timeout_s: float) -> None:
    for i, proc in enumerate(procs):
        if proc.wait(timeout=timeout_s) != 0:
            raise RuntimeError(f"trainer process {i} exited {proc.returncode}:\n"
                               f"{(logs / f'p{i}.log').read_text()[-4000:]}")


def published_params(url: str) -> list[Any]:
    """Final parameters of a finished trainer (the version ``train/DONE.json`` names), as float64 numpy."""
    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.model.weights import load_weights
    from pipelines_lib.records import DoneMarker
    from pipelines_lib.storage import layout
    from pipelines_lib.storage.store import Store

    store = Store(url)
    done = DoneMarker.read(store)
    model = load_weights(store.uri(layout.weights_dir(done.version)))
    return [np.asarray(p, np.float64) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


def rel_diff(params: list[Any], reference: list[Any]) -> float:
    import numpy as np

    flat, flat_ref = (np.concatenate([p.ravel() for p in ps]) for ps in (params, reference))
    return float(np.linalg.norm(flat - flat_ref) / np.linalg.norm(flat_ref))


def part_reference(args: dict[str, Any]) -> dict[str, Any]:
    """The streaming trainer on one device over a copy of ``args["seed"]`` (its distributed section dropped)."""
    from pipelines_lib.distributed import DistributedConfig
    from pipelines_lib.mesh import MeshConfig
    from pipelines_lib.stages.campaign import load_campaign_config
    from pipelines_lib.stages.train import trainer_for
    from pipelines_lib.storage.store import Store

    shutil.copytree(args["seed"], args["out"])
    store = Store(args["out"])
    config = load_campaign_config(store)
    config = dataclasses.replace(config, distributed=DistributedConfig(),
                                 trainer=dataclasses.replace(config.trainer, mesh=MeshConfig()))
    trainer = trainer_for(store, config, log=lambda line: None)
    trainer.run()
    return {"losses": [m["loss"] for m in trainer.metrics]}


MP = {"processes": 2, "devices_per_process": 4, "steps": 4, "mesh": {"data": 2, "fsdp": -1}}
"""The multi-process runs: 2 processes × 4 fake devices, one data=2 × fsdp=4 mesh over both."""


def _not_orbax(folder: Path) -> set[str]:
    """Files of a campaign folder other than Orbax's own (which differ with the number of writing processes)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "/state/" not in str(p)}


def two_process_run(root: Path) -> dict[str, Any]:
    """Seed a campaign, train it with two processes and, from a copy, with one device; compare."""
    import numpy as np

    from pipelines_lib.records import ConsumptionLog
    from pipelines_lib.storage import layout
    from pipelines_lib.storage.store import Store

    seed = seed_multiprocess_campaign(root / "seed", steps=MP["steps"], n_processes=MP["processes"], mesh=MP["mesh"])
    shutil.copytree(seed, root / "two")
    wait_all(launch_trainers(str(root / "two"), MP["processes"], MP["devices_per_process"], root / "logs-two"),
             root / "logs-two", timeout_s=600)
    reference = part_reference({"seed": seed, "out": str(root / "one")})
    store = Store(str(root / "two"))
    losses = [ConsumptionLog.read(store, step).metrics["loss"] for step in range(1, MP["steps"] + 1)]
    two, one = _not_orbax(root / "two"), _not_orbax(root / "one")
    return {
        "losses": losses, "reference_losses": reference["losses"],
        "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, reference["losses"], strict=True)),
        "param_rel_diff": rel_diff(published_params(str(root / "two")), published_params(str(root / "one"))),
        "telemetry_files": sorted(f for f in two if f.startswith(f"{layout.TELEMETRY}/")),
        "files_only_in_two": sorted(f for f in two - one if not f.startswith(f"{layout.TELEMETRY}/")),
        "files_only_in_one": sorted(one - two),
        "final_params_sum": float(sum(np.sum(p) for p in published_params(str(root / "two")))),
    }


def peer_loss_run(root: Path, uninterrupted: str, *, kill_after_step: int = 2) -> dict[str, Any]:
    """From a copy of ``root/seed``: SIGKILL process 1 once step ``kill_after_step`` is logged, time process 0's
    exit, restart both, and compare the final parameters with the ``uninterrupted`` run's bit for bit."""
    import signal
    import time

    import numpy as np

    from pipelines_lib.storage import layout

    folder = root / "killed"
    shutil.copytree(root / "seed", folder)
    logs = root / "logs-killed"
    procs = launch_trainers(str(folder), MP["processes"], MP["devices_per_process"], logs)
    marker = folder / layout.consumed_log(kill_after_step)
    deadline = time.monotonic() + 600
    while not marker.exists():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError(f"step {kill_after_step} was never logged:\n{(logs / 'p0.log').read_text()[-3000:]}")
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        survivor_rc = procs[0].wait(timeout=300)
    finally:
        procs[0].kill()
        procs[1].wait()
    exit_s = time.monotonic() - killed_at
    survivor_log = (logs / "p0.log").read_text(errors="replace")
    restart_logs = root / "logs-restart"
    wait_all(launch_trainers(str(folder), MP["processes"], MP["devices_per_process"], restart_logs), restart_logs,
             timeout_s=600)
    resumed, full = published_params(str(folder)), published_params(uninterrupted)
    return {"survivor_rc": survivor_rc, "exit_s": exit_s,
            "names_peer": "stopped sending heartbeats" in survivor_log and
                          survivor_log.split("stopped sending heartbeats):", 1)[-1].split()[0] == "1",
            "restart_log": (restart_logs / "p0.log").read_text(errors="replace")[-2000:],
            "resume_identical": all(np.array_equal(a, b) for a, b in zip(resumed, full, strict=True))}


def _adam_bytes_per_device(name: str, n_devices: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import AbstractMesh, AxisType

    from pipelines_lib.mesh import state_shardings
    from pipelines_lib.model.config import ModelConfig
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.train.optim import OptimConfig, make_optimizer

    cfg = ModelConfig(**SHAPES[name], max_seq_len=MICRO_BATCH["seq_len"], dtype="bfloat16")
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    mesh = AbstractMesh((1, n_devices, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    shardings = state_shardings(params, mesh)

    leaves = jax.tree.leaves(params)
    total = sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves)
    param_dev = sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
                    for x, s in zip(leaves, jax.tree.leaves(shardings), strict=True))
    opt = jax.eval_shape(make_optimizer(OptimConfig()).init, params)
    # Adam's two moments have their parameter's shape and dtype and inherit its sharding (pipelines_lib/mesh.py).
    moments = 2 * param_dev
    assert sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(opt)) >= 2 * total
    # Activations under per-layer remat: each layer's input kept ([rows, seq, d_model]), one layer's internals
    # live during its recompute (q/k/v/o, the MLP's three [seq, d_ff] products, the [heads, seq, seq] scores in
    # float32), and the float32 logits of the micro-batch.
    rows, seq = MICRO_BATCH["rows_per_device"], MICRO_BATCH["seq_len"]
    bf16 = jnp.dtype("bfloat16").itemsize
    kept = cfg.n_layers * rows * seq * cfg.d_model * bf16
    layer = rows * seq * ((cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * 2 + 3 * cfg.d_ff) * bf16
    scores = rows * cfg.n_heads * seq * seq * 4
    logits = rows * seq * cfg.vocab_size * 4
    activations = kept + layer + scores + logits
    return {"params_total_gib": total / 2**30, "param_gib": param_dev / 2**30, "moments_gib": moments / 2**30,
            "activations_gib": activations / 2**30,
            "total_gib": (param_dev + moments + activations) / 2**30,
            "over_ideal": param_dev / (total / n_devices), "n_params": float(np.sum([
                math.prod(x.shape) for x in jax.tree.leaves(params)]))}


def part_fits(args: dict[str, Any]) -> dict[str, Any]:
    return {name: {str(n): _adam_bytes_per_device(name, n) for n in args["devices"]} for name in args["models"]}


def part_engine(args: dict[str, Any]) -> dict[str, Any]:
    """Greedy completions of ``args["requests"]`` prompts on one device and on a ``tensor`` mesh of every device,
    swapping to a second set of weights after the first half."""
    import asyncio

    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.engine import JaxEngine, SamplingParams
    from pipelines_lib.engine.config import EngineConfig
    from pipelines_lib.mesh import MeshConfig
    from pipelines_lib.model.config import ModelConfig
    from pipelines_lib.model.decoder import Decoder

    cfg = dataclasses.replace(ModelConfig.tiny(), n_layers=2, d_model=64, n_heads=8, n_kv_heads=4, head_dim=16,
                              d_ff=128, max_seq_len=128)
    first, second = (Decoder(cfg, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, size=int(n)).tolist() for n in rng.integers(4, 40, args["requests"])]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args["max_new_tokens"])
    half = len(prompts) // 2

    async def serve(mesh: MeshConfig) -> dict[str, Any]:
        config = EngineConfig(num_slots=8, max_seq_len=128, prefill_buckets=(16, 32, 64), mesh=mesh)
        async with JaxEngine(first, config) as engine:
            before = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts[:half]))
            engine.swap_weights(nnx.state(second, nnx.Param), version=1)
            after = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts[half:]))
            params = jax.tree.leaves(engine._params)
            return {"tokens": [c.token_ids for c in (*before, *after)],
                    "versions": sorted({v for c in (*before, *after) for v in c.policy_versions}),
                    "q_proj_spec": [str(a) for a in engine._params["layers"]["attn"]["q_proj"]["kernel"].sharding.spec],
                    "cache_spec": [str(a) for a in engine._runner.cache.k_lnskd.sharding.spec],
                    "param_devices": max(len(p.sharding.device_set) for p in params),
                    "compilations": engine.stats()["compilations"]}

    one = asyncio.run(serve(MeshConfig()))
    tp = asyncio.run(serve(MeshConfig(tensor=-1)))
    return {"identical": one["tokens"] == tp["tokens"], "tokens": sum(map(len, tp["tokens"])), "one": {
        k: v for k, v in one.items() if k != "tokens"}, "tp": {k: v for k, v in tp.items() if k != "tokens"}}


CAMPAIGN_MESH = ("trainer.mesh.fsdp=4", "engine.mesh.tensor=2")
"""The whole-campaign runs' meshes: the trainer's parameters and Adam state over 4 devices (FSDP), each rollout
engine's heads, MLP, vocabulary and KV cache over 2 (tensor parallel); warm start and evaluation on one device."""
CAMPAIGN_DEVICES = 8


def campaign_args(preset: str, *, mesh: bool) -> list[str]:
    """``flows.campaign`` arguments of a whole campaign of ``preset``, on ``CAMPAIGN_MESH`` or on one device."""
    return ["--preset", preset, *(a for item in (CAMPAIGN_MESH if mesh else ()) for a in ("--set", item))]


def ends_success(url: str) -> dict[str, float]:
    """Held-out greedy success of v0 and of the last published version of a finished campaign."""
    from pipelines_lib import records
    from pipelines_lib.records import EvalResult
    from pipelines_lib.storage.store import Store

    store = Store(url)
    versions = records.published_versions(store)
    return {"v0_success": EvalResult.read(store, min(versions)).greedy_success_rate,
            "final_success": EvalResult.read(store, max(versions)).greedy_success_rate,
            "final_version": float(max(versions))}


THROUGHPUT_MODEL = {"vocab_size": 512, "d_model": 512, "n_layers": 6, "n_heads": 8, "n_kv_heads": 4, "head_dim": 64,
                    "d_ff": 1536, "max_seq_len": 64}
"""The ``throughput`` part's decoder: ~19 M parameters (6 layers of 3.1 M, tied 512 × 512 embedding)."""
THROUGHPUT_BATCH = {"rows": 8, "seq_len": 64, "steps": 3}
"""One row per device under fsdp=8; timed steps per mesh after one untimed (compiling) step."""
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
"""HLO collectives whose execution the ``throughput`` part's profile counts (names as XLA's CPU thunks log them)."""


def _hlo_op_share(xplane: str) -> dict[str, float]:
    """Seconds of HLO operations in a profile (summed over device threads), and the collectives' share of them.

    XLA's CPU runtime logs one event per executed HLO instruction (``dot.12``, ``all-gather.3``) next to its own
    bookkeeping (``ThunkExecutor::Execute``, ``Rendezvous``); instruction names are lower case, the rest is not.
    A collective's time includes its wait for the slowest participant, as a device profile would show it."""
    import re

    import jax

    instruction = re.compile(r"^[a-z][a-z0-9_\-]*(\.\d+)*$")
    total = collective = 0.0
    for plane in jax.profiler.ProfileData.from_file(xplane).planes:
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if instruction.match(event.name):
                    total += event.duration_ns
                    collective += event.duration_ns if event.name.split(".")[0] in COLLECTIVES else 0.0
    return {"hlo_op_s": total / 1e9, "collective_s": collective / 1e9,
            "collective_share": collective / total if total else 0.0}


def part_throughput(args: dict[str, Any]) -> dict[str, Any]:
    """Train steps/s of one ~20 M-parameter decoder on one device and on fsdp = every device (same global batch),
    and a profile of one fsdp step: the share of its HLO operation time spent in collectives."""
    import glob
    import tempfile
    import time

    import jax
    import numpy as np
    from flax import nnx

    from pipelines_lib.mesh import MeshConfig, create_sharded, make_mesh, shard_batch
    from pipelines_lib.model.config import ModelConfig
    from pipelines_lib.model.decoder import Decoder
    from pipelines_lib.train.batch import build_train_batch
    from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer
    from pipelines_lib.train.step import StepConfig, train_step

    cfg = ModelConfig(**args["model"])
    rows, seq, steps = args["rows"], args["seq_len"], args["steps"]
    rng = np.random.default_rng(0)
    batch = build_train_batch([rng.integers(1, cfg.vocab_size, size=seq).tolist() for _ in range(rows)],
                              [[0] + [1] * (seq - 1)] * rows, None, [(-1.0) ** i for i in range(rows)],
                              seq_buckets=(seq,))
    out: dict[str, Any] = {}
    for name, axes in {"1": {}, "fsdp": {"fsdp": -1}}.items():
        mesh = make_mesh(MeshConfig(**axes), devices=jax.devices()[:1] if name == "1" else None)
        model = create_sharded(lambda rngs: Decoder(cfg, rngs=rngs), mesh)
        optimizer = make_nnx_optimizer(model, OptimConfig(lr=1e-4), mesh)
        placed = shard_batch(batch, mesh)
        jax.block_until_ready(train_step(model, optimizer, placed, cfg=StepConfig()))  # compiles
        t0 = time.perf_counter()
        for _ in range(steps):
            jax.block_until_ready(train_step(model, optimizer, placed, cfg=StepConfig()))
        step_s = (time.perf_counter() - t0) / steps
        out[name] = {"devices": mesh.size, "step_s": step_s, "tokens_per_s": rows * seq / step_s}
        if name == "fsdp":
            with tempfile.TemporaryDirectory() as trace:
                with jax.profiler.trace(trace):
                    jax.block_until_ready(train_step(model, optimizer, placed, cfg=StepConfig()))
                out[name] |= _hlo_op_share(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)[0])
        out["n_params"] = int(sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
    return out


PARTS = {"mesh": part_mesh, "fits": part_fits, "reference": part_reference, "engine": part_engine,
         "throughput": part_throughput}


@register_bench(
    "scale",
    title="Training across devices: same numbers on any mesh, and which model fits which slice",
    measures="(1) The streaming trainer on 8 fake CPU devices over one campaign folder on meshes 1, fsdp=8 and "
             "data=2 × fsdp=2 × tensor=2: the largest relative difference of its final parameters from the "
             "one-device run (`scale.mesh_param_rel_diff`) and of its per-step losses. (2) Who fits where: "
             "per-device bytes of bf16 parameters + Adam moments + one micro-batch of activations for "
             "Qwen3-0.6B, Qwen3-8B, Llama-3-8B and Gemma-3-12B shapes on 8, 16, 64 and 256 devices (FSDP over "
             "all of them), and per-device parameter bytes over total / devices (`scale.fsdp_bytes_over_ideal`, "
             "the worst case). (3) Two processes × 4 fake devices (`jax.distributed`, gloo on 127.0.0.1) training "
             "the same campaign: final parameters against one device, seconds from SIGKILL of process 1 to "
             "process 0's non-zero exit, and whether a restart ends bit-identical to an uninterrupted "
             "two-process run. (4) The engine with tensor-parallel parameters and a KV cache split over kv heads "
             "on 4 fake devices: greedy completions identical to one device's. (5) A whole campaign with "
             "`trainer.mesh.fsdp=4` and `engine.mesh.tensor=2` on 8 fake devices against the same campaign on one "
             "device: held-out greedy success of v0 and of the last version (`scale.campaign_mesh_final_success`, "
             "`scale.campaign_one_device_final_success`), reported side by side (a slow test in `tests/test_mesh.py` holds "
             "the mesh run to 75 %, the one-device demo's ~96 % less 20 points of run-to-run spread). (6) Reported, not a goal: trainer tokens/s of a ~20 "
             "M-parameter decoder on fsdp=8 over tokens/s on one device (`scale.tokens_per_s_8_over_1`) and the "
             "share of a profiled fsdp=8 step's HLO operation time spent in collectives (`scale.collective_share`). "
             "Fake CPU devices share the machine's cores, so 8 devices are not 8 × the compute: the figures catch "
             "pathologies (a full gather per layer, a collective-bound step), they are not a speed-up.",
    method="`bench/scale.py`, each part in its own interpreter. Mesh: a 2-layer decoder (width 64, 4 heads, 2 kv "
           "heads) trained 4 GRPO steps of 2 groups × 4 on synthetic shards, publishing and checkpointing every 2 "
           "steps, with `trainer.mesh` set; relative differences are ‖θ_mesh − θ_1‖ / ‖θ_1‖ over all parameters "
           "and |loss_mesh − loss_1| / |loss_1| per step. Fits: `nnx.eval_shape` of the decoder from each "
           "model's public config values in bfloat16 (nothing allocated), shardings from the rules table "
           "(`pipelines_lib/mesh.py`) on an abstract mesh of `fsdp` = devices; Adam's moments are counted at their "
           "parameter's sharding; activations: one 4096-token sequence per device with per-layer remat (layer "
           "inputs kept, one layer's q/k/v/MLP products and float32 scores, float32 logits). A slice fits when "
           "the total is below 90 % of its chips' memory (v5e 16 GiB, v6e 32 GiB, H100 80 GiB, v5p 95 GiB). "
           "Multi-process: the mesh part's model and shards, `rollstream train URL --process-id i` per process on "
           "a data=2 × fsdp=4 mesh spanning both, `distributed.heartbeat_timeout_s` 10; process 1 is killed once "
           "step 2's consumption log exists, then both are restarted on the same folder. Engine: a 2-layer decoder "
           "(8 heads, 4 kv heads), 32 greedy requests of 12 new tokens, prompts of 4 to 40 random ids, the first "
           "16 on one set of weights, then `swap_weights` to another and the last 16, on `engine.mesh` 1 and "
           "tensor=4. Campaigns: `python -m flows.campaign URL --preset tiny --set eval.versions=ends` (what `make "
           "demo` runs; `--quick`: the smoke preset, whose policy learns nothing) in an interpreter with 8 fake devices "
           "and XLA's default optimisation, once with `--set trainer.mesh.fsdp=4 --set engine.mesh.tensor=2` and "
           "once without; 128 held-out tasks, greedy. Throughput: a decoder of 6 layers, width 512, 8 heads, 4 kv "
           "heads, MLP 1536 (19.4 M parameters), AdamW, one batch of 8 rows × 64 tokens; one untimed step, then 3 "
           "timed steps on one device and on fsdp=8 in the same interpreter; then one fsdp=8 step under "
           "`jax.profiler.trace`, whose per-instruction events (XLA's CPU runtime logs one per executed HLO "
           "instruction, on each device's thread) give the collectives' (all-gather, reduce-scatter, all-reduce, "
           "all-to-all, collective-permute) time over all instructions' time, both summed over threads; a "
           "collective's time includes its wait for the slowest device.",
    goals=(
        Goal(key="scale.mesh_param_rel_diff", op="<=", value=1e-5,
             why="a mesh changes where the numbers are computed, not what is learnt"),
        Goal(key="scale.fsdp_bytes_over_ideal", op="<=", value=1.1,
             why="FSDP stores 1 / devices of every parameter on each device"),
        Goal(key="scale.multiprocess_param_rel_diff", op="<=", value=1e-5,
             why="two processes train what one device trains"),
        Goal(key="scale.multiprocess_resume_identical", op=">=", value=1,
             why="a restart after a lost peer resumes exactly from the write-ahead log"),
        Goal(key="scale.multiprocess_peer_loss_exit_s", op="<=", value=60,
             why="a lost peer fails the job, never hangs it in a collective"),
        Goal(key="scale.engine_tp_greedy_identical", op=">=", value=1,
             why="tensor parallelism serves the same tokens as one device"),
    ),
)
def bench_scale(ctx: BenchContext) -> BenchResult:
    ctx.progress("scale: mesh comparison on 8 fake devices")
    mesh = run_part("mesh", {"root": str(ctx.scratch / "mesh"), "steps": 4}, n_devices=8)
    ctx.progress("scale: two processes × 4 fake devices, then a killed peer and a restart")
    two = two_process_run(ctx.scratch / "mp")
    peer = peer_loss_run(ctx.scratch / "mp", str(ctx.scratch / "mp" / "two"))
    if peer["survivor_rc"] == 0 or not peer["names_peer"]:
        raise RuntimeError(f"the survivor of a killed peer exited {peer['survivor_rc']} without naming it")
    ctx.progress("scale: engine on a 4-device tensor mesh")
    engine = run_part("engine", {"requests": 32, "max_new_tokens": 12}, n_devices=4)
    ctx.progress("scale: who fits where (eval_shape)")
    fits = run_part("fits", {"models": list(SHAPES), "devices": list(DEVICE_COUNTS)}, n_devices=1)
    ctx.progress("scale: trainer tokens/s of a ~20 M-parameter decoder on 8 fake devices and on 1")
    throughput = run_part("throughput", THROUGHPUT_BATCH | {"model": THROUGHPUT_MODEL}, n_devices=8,
                          fast_compile=False)
    campaigns = {}
    for name, on_mesh in (("mesh", True), ("one_device", False)):
        url = str(ctx.scratch / f"campaign-{name}")
        wall = run_campaign(ctx, url, campaign_args("smoke" if ctx.quick else "tiny", mesh=on_mesh),
                            env=fake_devices_env(CAMPAIGN_DEVICES, fast_compile=False))
        campaigns[name] = ends_success(url) | {"wall_s": wall}
    others = [m for name, m in mesh["meshes"].items() if name != next(iter(MESHES))]
    figures = {
        "scale.mesh_param_rel_diff": max(m["param_rel_diff"] for m in others),
        "scale.mesh_loss_rel_diff": max(m["loss_rel_diff"] for m in others),
        "scale.fsdp_bytes_over_ideal": max(f["over_ideal"] for per in fits.values() for f in per.values()),
        "scale.multiprocess_param_rel_diff": two["param_rel_diff"],
        "scale.multiprocess_loss_rel_diff": two["loss_rel_diff"],
        "scale.multiprocess_resume_identical": float(peer["resume_identical"]),
        "scale.multiprocess_peer_loss_exit_s": peer["exit_s"],
        "scale.engine_tp_greedy_identical": float(engine["identical"]),
        "scale.tokens_per_s_8_over_1": throughput["fsdp"]["tokens_per_s"] / throughput["1"]["tokens_per_s"],
        "scale.tokens_per_s_1": throughput["1"]["tokens_per_s"],
        "scale.tokens_per_s_8": throughput["fsdp"]["tokens_per_s"],
        "scale.collective_share": throughput["fsdp"]["collective_share"],
        **{f"scale.campaign_{name}_{key}": value for name, run in campaigns.items() for key, value in run.items()},
    }
    rows = []
    for name, per in fits.items():
        for n, f in per.items():
            fits_on = [chip for chip, gib in HBM_GIB.items() if f["total_gib"] <= 0.9 * gib]
            rows.append({"model": name, "params (B)": round(f["n_params"] / 1e9, 2), "devices": int(n),
                         "params GiB/dev": round(f["param_gib"], 3), "Adam GiB/dev": round(f["moments_gib"], 3),
                         "activations GiB/dev": round(f["activations_gib"], 2),
                         "total GiB/dev": round(f["total_gib"], 2), "fits on": ", ".join(fits_on) or "none"})
    notes = "Mesh runs: " + "; ".join(
        f"{name}: param rel diff {m['param_rel_diff']:.1e}, loss rel diff {m['loss_rel_diff']:.1e}, embedding "
        f"{m['embed_spec']} shard {m['embed_shard_shape']}" for name, m in mesh["meshes"].items()) + "."
    notes += (f" Throughput: {throughput['n_params'] / 1e6:.1f} M parameters, {THROUGHPUT_BATCH['rows']} rows × "
              f"{THROUGHPUT_BATCH['seq_len']} tokens per step; 1 device {throughput['1']['step_s']:.2f} s/step, "
              f"fsdp=8 {throughput['fsdp']['step_s']:.2f} s/step; in a profiled fsdp=8 step "
              f"{throughput['fsdp']['collective_s']:.2f} s of {throughput['fsdp']['hlo_op_s']:.2f} s of HLO operations "
              f"(summed over device threads) were collectives. Campaigns ({'smoke' if ctx.quick else 'tiny'} preset, "
              f"{CAMPAIGN_DEVICES} fake devices): " + "; ".join(
                  f"{name}: v0 {run['v0_success']:.1%} -> v{run['final_version']:.0f} {run['final_success']:.1%} "
                  f"in {run['wall_s']:.0f} s" for name, run in campaigns.items()) + ".")
    return BenchResult(figures=figures, rows=rows, notes=notes)


if __name__ == "__main__":
    print(json.dumps(PARTS[sys.argv[1]](json.loads(sys.argv[2]))), flush=True)
