"""The train step on the real decoder (shrunk for compile speed), its batch builder and its optimizer."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from pipelines_lib.mesh import MeshConfig, make_mesh
from pipelines_lib.model.config import ModelConfig
from pipelines_lib.model.decoder import Decoder, layer_data, with_dtype
from pipelines_lib.train.batch import TrainBatch, batch_from_groups, bucket_length, build_train_batch
from pipelines_lib.train.losses import LossConfig
from pipelines_lib.train.optim import OptimConfig, make_nnx_optimizer, make_optimizer, make_schedule
from pipelines_lib.train.step import Precision, StepConfig, batch_rows, logprobs_fn, loss_inputs, train_step
from pipelines_lib.trajectory.channel import GroupSlice
from pipelines_lib.trajectory.record import to_table
from pipelines_lib.trajectory.synthetic import synthetic_group
from tests.conftest import float32_tolerance

ONE_DEVICE = make_mesh(MeshConfig())
"""Where optimizers are placed in tests that are not about meshes."""

# ModelConfig.tiny() with every dimension shrunk (one layer): the same code paths, a fraction of the
# compile time, which dominates these tests.
SMALL = dataclasses.replace(
    ModelConfig.tiny(), vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
BUCKETS = (16, 32)


@functools.cache
def _initial_model() -> Decoder:
    model = Decoder(SMALL, rngs=nnx.Rngs(0))
    # Committed like the step's outputs, so a second step on the same model reuses the first compile.
    nnx.update(model, jax.device_put(nnx.state(model), jax.devices()[0]))
    return model


def make_model() -> Decoder:
    """A fresh copy of one initial model (cloning skips re-running the initialisers). The arrays are
    copied too: ``train_step`` donates the model's buffers, which a plain clone would share."""
    model = nnx.clone(_initial_model())
    nnx.update(model, jax.tree.map(jnp.copy, nnx.state(model)))
    return model


# One transformation object for every test: it is static in the optimizer's graph, so a fresh
# optax.sgd(...) per test would miss the jit cache and recompile an identical step.
SGD = optax.sgd(1.0)


def sgd(model: Decoder) -> nnx.Optimizer:
    """Plain SGD with lr 1: the parameter change *is* the gradient, so gradients can be compared."""
    return nnx.Optimizer(model, SGD, wrt=nnx.Param)


def params_of(model: Decoder) -> list[np.ndarray]:
    return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


def ragged_rows(n_rows: int = 8, seed: int = 0):
    """Rows of 5..14 tokens: a 3-token prompt then generated tokens; advantages of both signs."""
    rng = np.random.default_rng(seed)
    tokens = [
        rng.integers(1, SMALL.vocab_size, size=int(n)).tolist() for n in rng.integers(5, 15, size=n_rows)
    ]
    masks = [[0] * 3 + [1] * (len(row) - 3) for row in tokens]
    behav = [(-rng.uniform(0.5, 5.0, size=len(row))).tolist() for row in tokens]
    advantages = rng.normal(size=n_rows).tolist()
    return tokens, masks, behav, advantages


# ----------------------------------------------------------------------------- logprobs_fn


def test_logprobs_fn_scores_each_token_given_only_its_prefix() -> None:
    model = make_model()
    tokens_bt = np.random.default_rng(0).integers(0, SMALL.vocab_size, size=(8, 16)).astype(np.int32)
    positions_bt = np.broadcast_to(np.arange(16, dtype=np.int32), (8, 16))
    logp_bt = np.asarray(logprobs_fn(model, tokens_bt, positions_bt))

    logits_btv = np.asarray(nnx.jit(lambda m, t, p: m(t, p))(model, tokens_bt, positions_bt), np.float64)
    logp_all_btv = logits_btv - np.log(np.exp(logits_btv).sum(-1, keepdims=True))
    expected_bt = np.take_along_axis(logp_all_btv[:, :-1], tokens_bt[:, 1:, None], -1)[..., 0]
    tol = float32_tolerance(1e-5)
    np.testing.assert_allclose(logp_bt[:, 1:], expected_bt, rtol=tol, atol=tol)
    assert (logp_bt[:, 0] == 0).all()

    # Changing token 6 changes its own score (t = 6) onwards, never the scores before it.
    changed_bt = tokens_bt.copy()
    changed_bt[:, 6] = (changed_bt[:, 6] + 1) % SMALL.vocab_size
    changed_logp_bt = np.asarray(logprobs_fn(model, changed_bt, positions_bt))
    np.testing.assert_allclose(changed_logp_bt[:, :6], logp_bt[:, :6], rtol=tol, atol=float32_tolerance(1e-6))
    assert not np.allclose(changed_logp_bt[:, 6], logp_bt[:, 6])


def test_vocabulary_sliced_scoring_gives_the_whole_logits_logprobs_entropies_and_gradients() -> None:
    model = make_model()
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    tokens_bt, positions_bt = batch.tokens_bt, batch.positions_bt
    c_bt = np.random.default_rng(1).normal(size=tokens_bt.shape).astype(np.float32)

    def whole(m: Decoder) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """The reference: log-softmax of the model's whole [B, T, V] logits."""
        logp_btv = jax.nn.log_softmax(m(tokens_bt, positions_bt), axis=-1)[:, :-1]
        logp_bt = jnp.take_along_axis(logp_btv, tokens_bt[:, 1:, None], axis=-1)[..., 0]
        entropy_bt = -(jnp.exp(logp_btv) * logp_btv).sum(-1)
        return (c_bt[:, 1:] * logp_bt).sum(), (logp_bt, entropy_bt)

    def sliced(m: Decoder, cfg: StepConfig) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        x = loss_inputs(m, batch_rows(batch, cfg), cfg=cfg)
        return (c_bt * x.logp_bt).sum(), (x.logp_bt[:, 1:], x.entropy_bt[:, 1:])

    ref_grads, (ref_logp, ref_entropy) = nnx.grad(whole, has_aux=True)(model)
    n_tokens = tokens_bt.size  # 8 rows of 16: 128 tokens over a vocabulary of 64
    tol = float32_tolerance(1e-5)
    for chunk in (1, 7, n_tokens):  # 64 slices of 1 entry, 32 of 2, the whole vocabulary at once
        grads, (logp, entropy) = nnx.grad(sliced, has_aux=True)(model, StepConfig(logit_chunk_tokens=chunk))
        np.testing.assert_allclose(logp, ref_logp, rtol=tol, atol=tol, err_msg=f"chunk {chunk}")
        np.testing.assert_allclose(entropy, ref_entropy, rtol=tol, atol=tol, err_msg=f"chunk {chunk}")
        g, g_ref = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(gs)]) for gs in (grads, ref_grads))
        assert np.linalg.norm(g - g_ref) <= tol * np.linalg.norm(g_ref), f"chunk {chunk}"


def test_step_config_rejects_a_logit_chunk_below_one_token() -> None:
    with pytest.raises(ValueError, match="logit_chunk_tokens must be >= 1"):
        StepConfig(logit_chunk_tokens=0)


def test_step_config_rejects_an_unknown_remat_policy_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"StepConfig.remat must be one of \['attention', 'dots', 'full', 'none'\], got True"):
        StepConfig(remat=True)


def test_step_config_rejects_an_unknown_attention_kernel_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"StepConfig.attention must be one of \['auto', 'xla', 'flash'\], got 'fast'"):
        StepConfig(attention="fast")


# ----------------------------------------------------------------------------- train_step


def assert_same_gradient(
    params_a: list[np.ndarray], params_b: list[np.ndarray], init_params: list[np.ndarray]
) -> None:
    """SGD(lr=1) moves params by minus the gradient; compare the moves as whole vectors.

    Tolerance: float32 summation order (micro-batch sums, padded reductions) perturbs single entries by
    ~1e-7 absolute, so the check is ``‖g_a − g_b‖ ≤ 1e-5 ‖g_b‖`` rather than per element (an accelerator's
    ``float32_tolerance``).
    """
    g_a, g_b = (
        np.concatenate([(p - p0).ravel() for p, p0 in zip(ps, init_params, strict=True)])
        for ps in (params_a, params_b)
    )
    assert np.linalg.norm(g_b) > 0
    assert np.linalg.norm(g_a - g_b) <= float32_tolerance(1e-5) * np.linalg.norm(g_b)


# The GRPO configuration shared by the tests below, so they reuse one compiled step. seq_mean_token_mean
# is the aggregation whose normaliser (loss tokens per row, rows with a loss token) padding and
# micro-batching could most easily get wrong; token_mean is pinned exactly in test_losses.py.
SEQ_MEAN = StepConfig(loss=LossConfig(aggregation="seq_mean_token_mean"))


def test_gradient_accumulation_reproduces_the_full_batch_step() -> None:
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    init_params = params_of(make_model())
    outcomes = {}
    for n_micro in (1, 2, 4):
        model = make_model()
        metrics = train_step(
            model, sgd(model), batch, cfg=dataclasses.replace(SEQ_MEAN, grad_accum_steps=n_micro)
        )
        outcomes[n_micro] = (metrics, params_of(model))
    full_metrics, full_params = outcomes[1]
    for n_micro in (2, 4):
        micro_metrics, micro_params = outcomes[n_micro]
        assert set(micro_metrics) == set(full_metrics)
        for key in full_metrics:
            np.testing.assert_allclose(
                micro_metrics[key],
                full_metrics[key],
                rtol=1e-5,
                atol=1e-7,
                err_msg=f"{key}, {n_micro} micro-batches",
            )
        assert_same_gradient(micro_params, full_params, init_params)


def test_implicit_proximal_logprobs_equal_logprobs_fn_at_step_start() -> None:
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    implicit, explicit = make_model(), make_model()
    prox_logp_bt = logprobs_fn(explicit, batch.tokens_bt, batch.positions_bt)
    implicit_metrics = train_step(implicit, sgd(implicit), batch, cfg=SEQ_MEAN)
    explicit_batch = batch.replace(prox_logp_bt=prox_logp_bt)
    explicit_metrics = train_step(explicit, sgd(explicit), explicit_batch, cfg=SEQ_MEAN)
    np.testing.assert_allclose(explicit_metrics["loss"], implicit_metrics["loss"], rtol=1e-5)
    assert_same_gradient(params_of(explicit), params_of(implicit), params_of(make_model()))


def test_behaviour_logprobs_from_the_same_weights_give_unit_importance_weights() -> None:
    # The sampler's logprobs (here: logprobs_fn of the same weights) are aligned with the trainer's,
    # so the decoupled correction is the identity and the step is ordinary clipped GRPO.
    model = make_model()
    tokens, masks, _, advantages = ragged_rows()
    draft = build_train_batch(tokens, masks, None, advantages, seq_buckets=BUCKETS)
    behav_logp_bt = np.asarray(logprobs_fn(model, draft.tokens_bt, draft.positions_bt))
    batch = draft.replace(behav_logp_bt=behav_logp_bt * draft.loss_mask_bt)
    metrics = train_step(model, sgd(model), batch, cfg=SEQ_MEAN)
    assert float(metrics["prox_behav_logp_abs_diff"]) < 1e-5
    assert float(metrics["prox_behav_logp_abs_diff_p99"]) < 1e-5
    np.testing.assert_allclose(metrics["behav_weight_mean"], 1.0, rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_max"], 1.0, rtol=1e-6)
    assert float(metrics["clip_frac_low"]) == float(metrics["clip_frac_high"]) == 0.0


def test_the_mismatch_p99_is_taken_over_the_loss_tokens_of_the_whole_batch() -> None:
    # A sampler whose logprobs sit 0.5 below the trainer's on one loss token and exactly on the rest: the mean
    # moves by 0.5 / n, the p99 is the largest gap once there are fewer than 100 loss tokens.
    model = make_model()
    tokens, masks, _, advantages = ragged_rows()
    draft = build_train_batch(tokens, masks, None, advantages, seq_buckets=BUCKETS)
    behav_logp_bt = np.asarray(logprobs_fn(model, draft.tokens_bt, draft.positions_bt)) * draft.loss_mask_bt
    b, t = np.argwhere(np.asarray(draft.loss_mask_bt) > 0)[-1]
    behav_logp_bt[b, t] -= 0.5
    metrics = train_step(model, sgd(model), draft.replace(behav_logp_bt=behav_logp_bt), cfg=SEQ_MEAN)
    n = float(np.asarray(draft.loss_mask_bt).sum())
    assert n < 100
    np.testing.assert_allclose(metrics["prox_behav_logp_abs_diff_p99"], 0.5, rtol=1e-5)
    np.testing.assert_allclose(metrics["prox_behav_logp_abs_diff"], 0.5 / n, rtol=1e-3)
    # KL(π_behav ‖ π_prox) by k3 on that one token: ρ − log ρ − 1 with log ρ = 0.5, averaged over n tokens.
    np.testing.assert_allclose(metrics["behav_prox_kl"], (math.exp(0.5) - 0.5 - 1) / n, rtol=1e-3)


def test_padding_rows_and_longer_buckets_leave_the_update_unchanged() -> None:
    rows = ragged_rows()
    tight = build_train_batch(*rows, seq_buckets=(16,))
    padded = build_train_batch(*rows, seq_buckets=(32,), batch_size=12)
    assert tight.shape == (8, 16) and padded.shape == (12, 32)
    init_params = params_of(make_model())
    outcomes = []
    for batch in (tight, padded):
        model = make_model()
        metrics = train_step(model, sgd(model), batch, cfg=SEQ_MEAN)
        outcomes.append((metrics, params_of(model)))
    np.testing.assert_allclose(outcomes[1][0]["loss"], outcomes[0][0]["loss"], rtol=float32_tolerance(1e-5))
    assert_same_gradient(outcomes[1][1], outcomes[0][1], init_params)


def sequence_logp(model: Decoder, batch: TrainBatch) -> np.ndarray:
    return (np.asarray(logprobs_fn(model, batch.tokens_bt, batch.positions_bt)) * batch.loss_mask_bt).sum(
        axis=1
    )


def test_grpo_steps_make_positive_advantage_completions_likelier() -> None:
    # Two completions of one prompt; the rewarded one must gain probability, the other lose it.
    prompt = [5, 6, 7]
    tokens = [prompt + [10, 11, 12, 13], prompt + [20, 21, 22, 23]]
    masks = [[0, 0, 0, 1, 1, 1, 1]] * 2
    model = make_model()
    draft = build_train_batch(tokens, masks, None, [1.0, -1.0], seq_buckets=BUCKETS, batch_size=8)
    batch = draft.replace(
        behav_logp_bt=np.asarray(logprobs_fn(model, draft.tokens_bt, draft.positions_bt)) * draft.loss_mask_bt
    )
    before = sequence_logp(model, batch)
    optimizer = make_nnx_optimizer(model, OptimConfig(lr=3e-3), ONE_DEVICE)
    for _ in range(3):
        train_step(model, optimizer, batch, cfg=StepConfig())
    after = sequence_logp(model, batch)
    assert after[0] > before[0] + 0.5 and after[1] < before[1] - 0.5, (before, after)


def test_sft_nll_step_fits_the_loss_tokens() -> None:
    tokens, masks, _, _ = ragged_rows()
    batch = build_train_batch(tokens, masks, seq_buckets=BUCKETS)
    model = make_model()
    optimizer = make_nnx_optimizer(model, OptimConfig(lr=1e-2), ONE_DEVICE)
    cfg = StepConfig(loss=LossConfig(name="nll"))
    nll = [float(train_step(model, optimizer, batch, cfg=cfg)["nll"]) for _ in range(8)]
    # A fresh model is near uniform over 64 tokens (its random logits add 0.46 to 0.79 nats over ln 64 on these
    # rows, by the draw: seeds 0-5 measured); 8 steps must have cut the NLL well below that.
    assert abs(nll[0] - math.log(SMALL.vocab_size)) < 1.0, nll
    assert nll[-1] < nll[0] - 1.0, nll


def test_kl_to_an_identical_reference_is_zero_and_a_reference_is_required() -> None:
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    model, reference = make_model(), make_model()  # identical weights
    cfg = StepConfig(loss=LossConfig(kl_coef=0.1))
    metrics = train_step(model, sgd(model), batch, reference, cfg=cfg)
    assert abs(float(metrics["kl"])) < 1e-6
    with pytest.raises(ValueError, match="needs a ref_model"):
        train_step(model, sgd(model), batch, cfg=cfg)


def test_grad_accum_steps_must_divide_the_rows() -> None:
    batch = build_train_batch(*ragged_rows(n_rows=6), seq_buckets=BUCKETS)
    model = make_model()
    with pytest.raises(ValueError, match="grad_accum_steps=4"):
        train_step(model, sgd(model), batch, cfg=StepConfig(grad_accum_steps=4))
    with pytest.raises(ValueError, match="grad_accum_steps must be >= 1, got 0"):
        StepConfig(grad_accum_steps=0)


# ----------------------------------------------------------------------------- batch builder


def test_build_train_batch_pads_right_to_the_smallest_bucket() -> None:
    batch = build_train_batch(
        [[1, 2, 3], [4, 5, 6, 7, 8]],
        [[0, 1, 1], [0, 0, 1, 1, 0]],
        [[9.0, -0.5, -0.25], [9.0, 9.0, -1.0, -2.0, 9.0]],
        [2.0, -1.0],
        seq_buckets=(4, 8, 16),
        batch_size=3,
        pad_id=63,
    )
    assert batch.shape == (3, 8)
    np.testing.assert_array_equal(batch.tokens_bt[0], [1, 2, 3, 63, 63, 63, 63, 63])
    np.testing.assert_array_equal(batch.tokens_bt[2], [63] * 8)
    np.testing.assert_array_equal(batch.loss_mask_bt[1], [0, 0, 1, 1, 0, 0, 0, 0])
    # Logprobs off the loss mask are zeroed; advantages are broadcast over the row.
    np.testing.assert_array_equal(batch.behav_logp_bt[1], [0, 0, -1.0, -2.0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.advantages_bt[0, :3], [2.0, 2.0, 2.0])
    assert not batch.loss_mask_bt[2].any()
    np.testing.assert_array_equal(batch.positions_bt[1], np.arange(8))
    assert batch.tokens_bt.dtype == np.int32 and batch.loss_mask_bt.dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens": [[1, 2, 3, 4, 5]], "loss_masks": [[0, 1, 1, 1, 1]], "behav_logps": [[0.0, -1.0, -1.0, -1.0, -1.0]]},
         "exceeds the largest sequence bucket 4"),
        ({"loss_masks": [[1, 1, 1]]}, "token 0 has no prefix"),
        ({"loss_masks": [[0, 1]]}, "row 0: 3 tokens but 2 mask entries"),
        ({"advantages": [1.0, 2.0]}, "row counts differ"),
        ({"batch_size": 0}, "need 1..batch_size=0 rows"),
        ({"seq_buckets": ()}, "at least one sequence bucket"),
    ],
)
def test_build_train_batch_refuses_malformed_rows(kwargs: dict, match: str) -> None:
    args = {
        "tokens": [[1, 2, 3]],
        "loss_masks": [[0, 1, 1]],
        "behav_logps": [[0.0, -1.0, -1.0]],
        "advantages": [1.0],
    }
    with pytest.raises(ValueError, match=match):
        build_train_batch(**({"seq_buckets": (4,)} | args | kwargs))


def test_bucket_length_picks_the_smallest_fitting_bucket() -> None:
    assert [bucket_length(n, (64, 16, 32)) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]


# ----------------------------------------------------------------------------- optimizer


def test_schedules_warm_up_linearly_then_hold_or_decay_to_the_floor() -> None:
    cosine = make_schedule(
        OptimConfig(lr=1.0, warmup_steps=4, schedule="cosine", total_steps=14, min_lr_ratio=0.1)
    )
    # Warmup 0, .25, .5, .75; cosine from 1 at step 4 to 0.1 at step 14, halfway (step 9) at (1 + .1) / 2.
    np.testing.assert_allclose(
        [cosine(s) for s in (0, 1, 2, 3, 4, 9, 14)], [0, 0.25, 0.5, 0.75, 1.0, 0.55, 0.1], atol=1e-6
    )
    constant = make_schedule(OptimConfig(lr=0.5, warmup_steps=2))
    np.testing.assert_allclose([constant(s) for s in (0, 1, 2, 100)], [0, 0.25, 0.5, 0.5], atol=1e-7)


def test_optimizer_clips_the_global_norm_and_decays_only_matrices() -> None:
    cfg = OptimConfig(lr=0.1, weight_decay=0.5, grad_clip_norm=1.0, b1=0.5, b2=0.5)
    tx = make_optimizer(cfg)
    update = jax.jit(tx.update)
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones(2)}
    # Zero gradient: only decoupled weight decay moves params, by lr · wd · p, and on matrices only.
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = update(zero_grads, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_allclose(updates["scale"], 0.0)
    # A gradient of global norm sqrt(4·30² + 2·40²) = 76.2 reaches Adam clipped to norm 1, so the
    # first moment after one step is (1 − b1) · clipped gradient, of norm 0.5.
    big_grads = {"w": jnp.full((2, 2), 30.0), "scale": jnp.full(2, 40.0)}
    _, state = update(big_grads, tx.init(params), params)
    adam_state = state[1][0]
    np.testing.assert_allclose(optax.global_norm(adam_state.mu), 0.5, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"schedule": "linear"}, r"'linear'; choose one of \['constant', 'cosine'\]"),
        ({"lr": 0.0}, "lr must be > 0, got 0.0"),
        ({"warmup_steps": 20, "total_steps": 10}, "warmup_steps must be in"),
        ({"b2": 1.0}, "b2 must be in"),
        ({"grad_clip_norm": 0.0}, "grad_clip_norm"),
    ],
)
def test_optim_config_rejects_bad_values_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OptimConfig(**kwargs)


# ----------------------------------------------------------------------------- memory and precision


def test_the_step_updates_parameters_and_optimizer_state_in_their_own_buffers() -> None:
    model = make_model()
    optimizer = make_nnx_optimizer(model, OptimConfig(), ONE_DEVICE)
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    memory = train_step.lower(model, optimizer, batch, cfg=SEQ_MEAN).compile().memory_analysis()
    state_bytes = sum(x.nbytes for x in jax.tree.leaves((nnx.state(model), nnx.state(optimizer))))
    # Every parameter and Adam moment (and the step counter) is an input aliased to its output.
    assert memory.alias_size_in_bytes >= state_bytes > 0
    before = nnx.state(model, nnx.Param)["embed"]["embedding"][...]
    train_step(model, optimizer, batch, cfg=SEQ_MEAN)
    assert before.is_deleted()  # donated: the old buffer now holds the new values


def _remat_step_extra_bytes(n_layers: int, rows: int, length: int) -> tuple[int, int]:
    """(XLA's temporaries of the compiled remat step beyond the gradients, one token × width activation's
    bytes) for ``ModelConfig.tiny()`` at ``n_layers``: compiled from abstract parameters, nothing allocated."""
    cfg = dataclasses.replace(ModelConfig.tiny(), n_layers=n_layers)

    def build() -> tuple[Decoder, nnx.Optimizer]:
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        return model, make_nnx_optimizer(model, OptimConfig(), ONE_DEVICE)

    model, optimizer = nnx.eval_shape(build)
    ids = np.random.default_rng(0).integers(1, cfg.vocab_size, size=(rows, length)).tolist()
    batch = build_train_batch(ids, [[0] + [1] * (length - 1)] * rows, [[-1.0] * length] * rows, [1.0] * rows,
                              seq_buckets=(length,))
    memory = train_step.lower(model, optimizer, batch, cfg=dataclasses.replace(SEQ_MEAN, remat="full")).compile(
    ).memory_analysis()
    grad_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return memory.temp_size_in_bytes - grad_bytes, rows * length * cfg.d_model * 4


def test_the_remat_steps_temporaries_beyond_the_gradients_do_not_grow_with_depth() -> None:
    # Each layer adds its gradients to the step's temporaries, its input (one token × width activation, what
    # the full policy keeps) and its per-layer data (rope frequencies), and nothing else that lives past its
    # own backward pass: the reverse scan recomputes one layer at a time.
    shallow, activation = _remat_step_extra_bytes(2, rows=4, length=128)
    deep, _ = _remat_step_extra_bytes(6, rows=4, length=128)
    per_layer_data = sum(np.asarray(x)[0].nbytes for x in layer_data(ModelConfig.tiny()) if x is not None)
    assert deep - shallow <= 4 * (activation + per_layer_data), (shallow, deep, activation)


@pytest.mark.parametrize("remat", ["none", "full", "dots", "attention"])
def test_the_lowered_step_holds_one_layer_body_however_many_layers(remat: str) -> None:
    # The layers are scanned, not unrolled: compile time does not grow with depth.
    def dots(n_layers: int) -> int:
        cfg = dataclasses.replace(ModelConfig.tiny(), n_layers=n_layers)

        def build() -> tuple[Decoder, nnx.Optimizer]:
            model = Decoder(cfg, rngs=nnx.Rngs(0))
            return model, make_nnx_optimizer(model, OptimConfig(), ONE_DEVICE)

        model, optimizer = nnx.eval_shape(build)
        batch = build_train_batch(*ragged_rows(4), seq_buckets=BUCKETS)
        text = train_step.lower(model, optimizer, batch, cfg=dataclasses.replace(SEQ_MEAN, remat=remat)).as_text()
        return text.count("dot_general")

    two = dots(2)
    assert two > 0 and dots(4) == two


BF16 = dataclasses.replace(SEQ_MEAN, precision=Precision(params="float32", compute="bfloat16"))


def test_a_1e6_update_moves_float32_master_weights_as_predicted_under_bfloat16_compute() -> None:
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    w0 = params_of(make_model())
    # The step's gradient: plain SGD with lr 1 moves each weight by -g.
    probe = make_model()
    train_step(probe, sgd(probe), batch, cfg=BF16)
    g = [p0 - p for p0, p in zip(w0, params_of(probe), strict=True)]
    # Adam's first update is -lr · g / (|g| + eps): about 1e-6 for every weight with a gradient.
    model = make_model()
    train_step(model, nnx.Optimizer(model, ADAM_1E6, wrt=nnx.Param), batch, cfg=BF16)
    moved = 0
    for p0, p1, gi in zip(w0, params_of(model), g, strict=True):
        assert p1.dtype == np.float32
        predicted = -1e-6 * gi / (np.abs(gi) + 1e-8)
        known = np.abs(gi) > 1e-5  # where g, read back from a float32 difference, is accurate to 1e-3
        # The only error left is float32's rounding of w + Δ.
        assert np.all(np.abs((p1 - p0) - predicted)[known] <= np.abs(np.spacing(p0))[known] + 1e-9)
        moved += int(known.sum())
    assert moved > 0.9 * sum(p.size for p in w0)
    # The same step on bfloat16 parameters loses nearly all of it to rounding (the case master weights fix).
    bf16_model = with_dtype(make_model(), "bfloat16")
    all_bf16 = dataclasses.replace(BF16, precision=Precision(params="bfloat16", compute="bfloat16"))
    before = params_of(bf16_model)
    train_step(bf16_model, nnx.Optimizer(bf16_model, ADAM_1E6, wrt=nnx.Param), batch, cfg=all_bf16)
    unchanged = sum(int((a == b).sum()) for a, b in zip(before, params_of(bf16_model), strict=True))
    assert unchanged > 0.9 * sum(p.size for p in before)


ADAM_1E6 = optax.adam(1e-6)


def test_the_step_rejects_parameters_in_another_dtype_than_precision_params() -> None:
    model = with_dtype(make_model(), "bfloat16")
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    with pytest.raises(ValueError, match="model parameters are bfloat16, precision.params is float32"):
        train_step(model, sgd(model), batch, cfg=BF16)
    with pytest.raises(ValueError, match="Precision.compute must be one of"):
        Precision(compute="float8")


@pytest.mark.parametrize("policy", ["full", "dots", "attention"])
def test_every_remat_policy_gives_the_same_update(policy: str) -> None:
    batch = build_train_batch(*ragged_rows(), seq_buckets=BUCKETS)
    init_params = params_of(make_model())
    plain, remat = make_model(), make_model()
    m_plain = train_step(plain, sgd(plain), batch, cfg=SEQ_MEAN)
    m_remat = train_step(remat, sgd(remat), batch, cfg=dataclasses.replace(SEQ_MEAN, remat=policy))
    np.testing.assert_allclose(m_remat["loss"], m_plain["loss"], rtol=1e-6)
    assert_same_gradient(params_of(remat), params_of(plain), init_params)


def _group_slice(rewards: list[float], seed: int) -> GroupSlice:
    """A whole group whose rows are stored in reverse sample order, with the given rewards."""
    group = [dataclasses.replace(t, reward=r) for t, r in zip(
        synthetic_group(prompt_id=f"p{seed}", group_size=len(rewards), worker_id="w", policy_version=0, seed=seed),
        rewards, strict=True)]
    return GroupSlice(shard="s.arrow", version=0, row_start=0, row_end=len(group), group_id=group[0].group_id,
                      table=to_table(group[::-1]))


def test_batch_from_groups_reads_arrow_rows_in_sample_order_with_group_advantages() -> None:
    """Rewards [1, 0] give GRPO advantages ±0.5 / (0.5 + 1e-6); the all-equal [0.5, 0.5] group exactly 0. The rows
    match the ragged-rows path on the same samples, sorted by sample index."""
    groups = [_group_slice([1.0, 0.0], seed=1), _group_slice([0.5, 0.5], seed=2)]
    batch, loss_tokens = batch_from_groups(groups, group_size=2, advantage="grpo", seq_buckets=(64, 128),
                                           batch_size=6, pad_id=0)
    rows = [r for g in groups for r in sorted(g.table.to_pylist(), key=lambda r: r["sample_idx"])]
    a = 0.5 / (0.5 + 1e-6)
    expected = build_train_batch([r["tokens"] for r in rows], [r["loss_mask"] for r in rows],
                                 [r["logprobs"] for r in rows], [a, -a, 0.0, 0.0], seq_buckets=(64, 128),
                                 batch_size=6)
    for name in ("tokens_bt", "positions_bt", "loss_mask_bt", "behav_logp_bt"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name), err_msg=name)
    np.testing.assert_allclose(batch.advantages_bt, expected.advantages_bt, rtol=1e-6)
    assert batch.advantages_bt[2:].max() == 0.0 and batch.advantages_bt[2:].min() == 0.0
    assert loss_tokens == sum(sum(r["loss_mask"]) for r in rows)
    with pytest.raises(ValueError, match="has 2 samples, the campaign's group_size is 3"):
        batch_from_groups(groups, group_size=3, advantage="grpo", seq_buckets=(128,), batch_size=6, pad_id=0)


@pytest.mark.tpu
def test_the_flash_kernel_gives_the_update_xla_attention_gives() -> None:
    """On one TPU device: a GRPO step over rows of 256 tokens (the kernel's 128-multiple) in bfloat16 compute, once
    through the Pallas splash kernel and once through XLA's attention, lands within bfloat16 rounding of the same
    update (the gradients as whole vectors within 3 %; a wrong mask or scale moves them by far more)."""
    cfg = dataclasses.replace(ModelConfig.tiny(), n_layers=2, head_dim=128)
    batch = build_train_batch(*ragged_rows(), seq_buckets=(256,))
    base = Decoder(cfg, rngs=nnx.Rngs(0))
    init = params_of(base)
    step = StepConfig(precision=Precision(params="float32", compute="bfloat16"))
    models = {k: nnx.clone(base) for k in ("xla", "flash")}
    for m in models.values():  # own buffers: the step donates them
        nnx.update(m, jax.tree.map(jnp.copy, nnx.state(m)))
    # The tier raises every float32 matmul to highest precision (tests/conftest.py); Mosaic refuses that contraction
    # on the kernel's bfloat16 operands ("Bad lhs type"), and a product of bfloat16 values is exact at the default.
    with jax.default_matmul_precision("default"):
        out = {k: train_step(m, sgd(m), batch, cfg=dataclasses.replace(step, attention=k))
               for k, m in models.items()}
    np.testing.assert_allclose(out["flash"]["loss"], out["xla"]["loss"], rtol=2e-2)
    g_flash, g_xla = (np.concatenate([(p0 - p).ravel() for p, p0 in zip(params_of(models[k]), init, strict=True)])
                      for k in ("flash", "xla"))
    assert np.linalg.norm(g_xla) > 0
    assert np.linalg.norm(g_flash - g_xla) <= 0.03 * np.linalg.norm(g_xla)
