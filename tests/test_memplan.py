"""The colocated memory plan (``pipelines_lib.memplan``): its arithmetic by hand on a toy model, ``num_blocks: auto``,
a campaign that cannot fit refused before anything is written, and the levers it counts (bfloat16 moments, the
hand-over without a second copy)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from pipelines_lib.cli import main
from pipelines_lib.config import CampaignConfig
from pipelines_lib.engine.config import EngineConfig
from pipelines_lib.memplan import MemoryConfig, MemoryPlanError, plan_memory
from pipelines_lib.model.config import ModelConfig, param_count
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.stages.colocated import DeviceWeights, run_colocated
from pipelines_lib.storage.store import Store
from pipelines_lib.train.config import TrainerConfig
from pipelines_lib.train.optim import OptimConfig, make_optimizer
from pipelines_lib.train.step import StepConfig

# vocab 16, d 8, one layer of 2 query heads and 1 KV head of 4, MLP 8, tied embeddings.
TOY = ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=8, max_seq_len=16,
                  tie_embeddings=True)
ENGINE = EngineConfig(num_slots=2, max_seq_len=8, block_size=4, prefill_buckets=(8,))


def _plan(engine: EngineConfig = ENGINE, limit: int | None = None, **trainer: object):
    return plan_memory(TOY, TrainerConfig(seq_buckets=(8,), **trainer), engine, group_size=2, workers=1, n_devices=1,
                       limit_bytes=limit, limit_source="test", headroom=0.0, step_temporaries=10_000)


def test_a_plan_counts_each_part_by_hand_on_a_toy_model() -> None:
    # embedding 128; q 64 + k 32 + v 32 + o 64 = 192; MLP 3·64 = 192; two norms 16; final norm 8.
    assert param_count(TOY) == 536
    plan = _plan()
    bytes_of = {p.name: p.bytes for p in plan.parts}
    assert bytes_of == {
        "trainer masters": 536 * 4, "trainer moments": 2 * 536 * 4, "trainer gradients": 536 * 4,
        "trainer temporaries": 10_000 - 536 * 4,  # XLA's temporaries hold the gradients
        "engine weights": 536 * 4 * 2,  # the served version and the one handed over
        # 2 slots × (logits and sampling, 2 · 4 · vocab 16 + prefill 8 tokens × widest 48 values × 4 bytes)
        "engine temporaries": 2 * (128 + 8 * 48 * 4),
        # 2 slots × 2 blocks of 4 positions × (1 layer × K,V × 1 head × 4) × 4 bytes
        "engine kv pool": 4 * 4 * 32,
    }
    assert plan.total_bytes == 24_560 and plan.kv_blocks == 4
    assert plan.part("trainer temporaries").basis == "XLA memory analysis"
    assert _plan(optim=OptimConfig(moment_dtype="bfloat16")).part("trainer moments").bytes == 2 * 536 * 2


def test_an_estimated_plan_counts_the_running_sum_of_accumulated_gradients() -> None:
    def estimated(batch_groups: int, accum: int) -> int:
        trainer = TrainerConfig(seq_buckets=(8,), batch_groups=batch_groups, step=StepConfig(grad_accum_steps=accum))
        part = plan_memory(TOY, trainer, ENGINE, group_size=2, workers=1, n_devices=1, limit_bytes=None,
                           limit_source="test", headroom=0.0).part("trainer temporaries")
        assert part.basis == "estimate"
        return part.bytes

    # 4 micro-batches of 2 rows against one batch of 2 rows: the same activations, and one float32 sum of the
    # gradients more (536 parameters of 4 bytes)
    assert estimated(4, 4) - estimated(1, 1) == 536 * 4


def test_num_blocks_auto_gives_the_pool_what_the_other_parts_leave() -> None:
    others = 24_560 - 512
    auto = dataclasses.replace(ENGINE, num_blocks="auto")
    assert _plan(auto, limit=others + 3 * 128 + 127).kv_blocks == 3
    assert _plan(auto, limit=others + 100 * 128).kv_blocks == 4  # never more than every slot at max_seq_len
    with pytest.raises(MemoryPlanError, match="the largest part is trainer temporaries"):
        _plan(auto, limit=others + 128).check()  # one block left: less than one sequence's two


def test_a_colocated_campaign_that_cannot_fit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    real = CampaignConfig.preset("tpu_real")
    config = dataclasses.replace(real, memory=MemoryConfig(device_gib=15.75),
                                 engine=dataclasses.replace(real.engine, num_slots=512, num_blocks=None))
    store = Store(str(tmp_path / "campaign"))
    with pytest.raises(MemoryPlanError, match=r"the largest part is engine kv pool \(10\.50 GiB, arithmetic\): "
                                              r"change engine\.num_blocks"):
        run_colocated(store, config, cache=tmp_path / "cache", log=lambda line: None)
    assert not (tmp_path / "campaign").exists()


def test_bfloat16_moments_are_stored_in_bfloat16_and_updated_in_float32() -> None:
    params = {"w": jnp.full((4, 4), 0.5, jnp.float32)}
    grads = {"w": jnp.full((4, 4), 1e-3, jnp.float32)}
    updates = {}
    for dtype in ("float32", "bfloat16"):
        opt = make_optimizer(OptimConfig(lr=1e-2, moment_dtype=dtype))
        state = opt.init(params)
        updates[dtype], state = opt.update(grads, state, params)
        floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
        assert floats and {x.dtype for x in floats} == {jnp.dtype(dtype)}
    assert jnp.allclose(updates["bfloat16"]["w"], updates["float32"]["w"], rtol=1e-2)


def test_a_hand_over_keeps_the_publications_cast_without_a_second_copy(tmp_path: Path) -> None:
    model = Decoder(TOY, rngs=nnx.Rngs(0))
    leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
    shared, copied = DeviceWeights(Store(str(tmp_path)), copy=False), DeviceWeights(Store(str(tmp_path)))
    for weights in (shared, copied):
        weights.hand_over(1, model)
    assert jax.tree.leaves(shared.load(1))[0] is leaf
    assert jax.tree.leaves(copied.load(1))[0] is not leaf


def test_num_blocks_auto_and_a_colocated_dtype_mismatch_are_refused_with_the_setting() -> None:
    with pytest.raises(ValueError, match="engine.num_blocks='auto' needs placement='colocated'"):
        CampaignConfig.tiny().with_overrides({"engine.num_blocks": "auto"})
    with pytest.raises(ValueError, match="set model.dtype and trainer.step.precision.compute alike"):
        CampaignConfig.preset("tpu_real").with_overrides({"model.dtype": "float32"})


def _parts(rendered: str) -> dict[str, float]:
    """GiB per part of a rendered plan."""
    return {line[:24].strip(): float(line[24:].split()[0]) for line in rendered.splitlines()[1:]}


def test_the_plan_command_shows_a_slice_dividing_the_trainers_state_and_refuses_what_cannot_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--preset", "tpu_real", "--device-gib", "15.75"]
    assert main(base) == 0
    one = _parts(capsys.readouterr().out)
    # Qwen3-0.6B, 596M parameters in float32: 2.22 GiB of masters, moments (bfloat16, two of them) and gradients
    assert one["trainer masters"] == one["trainer moments"] == one["trainer gradients"] == 2.220
    assert main([*base, "--devices", "4", "--set", "trainer.mesh.fsdp=-1"]) == 0
    four = _parts(capsys.readouterr().out)
    assert four["trainer masters"] == four["trainer moments"] == 0.555  # a quarter each, on every chip
    assert four["engine weights"] == one["engine weights"]  # the engines serve on the first chip, whole
    assert four["total"] < one["total"] - 3 * (2.220 - 0.555)  # the rows split too: fewer temporaries
    # 1 GiB cannot hold the model's masters: refused, naming the largest part and what shrinks it
    small = tmp_path / "small.yaml"
    small.write_text("memory:\n  device_gib: 1\n")
    assert main(["plan", "--preset", "tpu_real", "--config", str(small)]) == 1
    refusal = capsys.readouterr().out
    assert refusal.startswith("colocated memory plan: ") and "0.95 GiB available" in refusal
    assert "the largest part is trainer masters (2.22 GiB, arithmetic): change the model's size" in refusal


def test_the_plan_command_refuses_a_mesh_the_devices_cannot_hold_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "tpu_real", "--device-gib", "15.75", "--devices", "3",
                 "--set", "trainer.mesh.fsdp=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("data=1 × fsdp=4 × tensor=1 needs 4 devices, have 3")
    assert main(["plan", "--preset", "tiny", "--devices", "0"]) == 2
    assert "--devices must be >= 1, got 0" in capsys.readouterr().err
