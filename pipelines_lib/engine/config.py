"""Configuration of the inference engines: the built-in JAX engine's shapes, and the vLLM server backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipelines_lib.mesh import MeshConfig

MODES = ("continuous", "static")
ENGINE_KINDS = ("jax", "vllm")
"""``jax``: the built-in ``JaxEngine`` in the worker process (the embedded default and the reference).
``vllm``: a vLLM OpenAI-compatible server beside the worker, driven over HTTP (``engine.vllm``)."""
IN_FLIGHT_ON_RELOAD = ("finish", "abort")


@dataclass(frozen=True, kw_only=True)
class VllmConfig:
    """The vLLM backend: a server the worker launches and supervises, or one it connects to."""

    url: str | None = None
    """Base URL of a running server (``http://127.0.0.1:8000``) whose reload endpoints this worker may use; None
    launches one per worker with ``python`` and supervises it (readiness probe, restart on crash)."""
    python: str | None = None
    """Interpreter of the virtualenv with vLLM installed (``make vllm-venv`` makes ``.venv-vllm``); None means
    ``<repository>/.venv-vllm/bin/python``."""
    port: int = 0
    """Port of a launched server on 127.0.0.1; 0 picks a free one."""
    weights_dir: str | None = None
    """Local folder the worker downloads published HF folders into (from ``gs://`` campaigns); with a sidecar
    server (``url``) a volume both containers mount at the same path. None: a temporary folder of the worker."""
    max_num_seqs: int = 64
    """Requests the server decodes together (vLLM ``--max-num-seqs``)."""
    cpu_kv_cache_gib: int = 1
    """KV-cache size of a CPU server in GiB (``VLLM_CPU_KVCACHE_SPACE``); ignored on GPU/TPU builds."""
    extra_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags for a launched server (``--gpu-memory-utilization``, ``--tensor-parallel-size``)."""
    startup_timeout_s: float = 600.0
    """Longest wait for a launched server to answer its health probe (start, restart)."""
    request_timeout_s: float = 300.0
    """Longest one completion request may take; past it the episode fails as ``engine_error``."""
    reload_timeout_s: float = 300.0
    """Longest a weight sync (drain, reload, prefix-cache reset, resume) may take."""
    reload_retry_s: float = 30.0
    """After a failed reload, the same version is not tried again for this long (the old version keeps serving)."""
    in_flight_on_reload: str = "finish"
    """What happens to requests in flight when new weights arrive: ``finish`` lets them complete on the old
    weights before the reload; ``abort`` stops them at once and continues them on the new weights (each token
    keeps the version that produced it)."""
    max_restarts: int = 3
    """Crashes of a launched server the worker recovers from by restarting it; one more (or a restart that fails)
    stops the worker with an error naming the first error the server logged."""

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"VllmConfig.url must be an http(s) URL or null, got {self.url!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"VllmConfig.port must be in [0, 65535], got {self.port}")
        for name in ("max_num_seqs", "cpu_kv_cache_gib"):
            if getattr(self, name) < 1:
                raise ValueError(f"VllmConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("startup_timeout_s", "request_timeout_s", "reload_timeout_s", "reload_retry_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"VllmConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.in_flight_on_reload not in IN_FLIGHT_ON_RELOAD:
            raise ValueError(f"VllmConfig.in_flight_on_reload must be one of {IN_FLIGHT_ON_RELOAD}, "
                             f"got {self.in_flight_on_reload!r}")
        if self.max_restarts < 0:
            raise ValueError(f"VllmConfig.max_restarts must be >= 0, got {self.max_restarts}")


MIN_SPAN_POSITIONS = 128
"""Shortest attention span of a decode step, in positions: shorter spans would save reading a few keys/values
per row but cost a compilation each."""
ACCELERATOR_DECODE_STEPS = 8
"""Decode steps per device call on an accelerator by default: on a TPU v5e the host's work around one call is
about one decode step of a 0.6B model, so 8 steps leave the host a small share of the device's time; a request ending on a stop id idles its slot for at most two calls (16 slot-steps),
a few percent of completions hundreds of tokens long."""
MAX_SLOTS = 16_384
"""Most sequences one engine decodes at once (each holds a KV cache of ``max_seq_len``); serving engines run a
few hundred."""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Shapes fixed at construction: nothing the engine compiles depends on the requests it serves."""

    num_slots: int = 8
    """Sequences decoded together (rows of the decode step)."""
    max_seq_len: int = 256
    """Context limit: prompt + completion never exceed it (finish reason ``context``)."""
    block_size: int = 16
    """Positions per KV-cache block (``engine.blocks``); a decode step attends over the smallest
    power-of-two number of blocks (at least ``MIN_SPAN_POSITIONS``) covering its longest sequence
    (``attention_spans``). Larger blocks mean fewer, longer copies, whether a step gathers its blocks or the
    decode kernel copies them one by one: a TPU serving long contexts wants 64 (docs/TPU_PERF.md)."""
    num_blocks: int | Literal["auto"] | None = None
    """Blocks in the KV-cache pool. None sizes it for every slot at ``max_seq_len``; ``auto`` (colocated placement)
    gives it what the device's memory holds once the trainer's parts are counted (``pipelines_lib.memplan``), at most
    every slot at ``max_seq_len``; fewer makes the cache
    follow the tokens actually held: a request is admitted when the blocks of its prompt and
    ``max_new_tokens`` are free. At least one full-length sequence's worth. Blocks no running request holds
    keep finished requests' keys/values for reuse (``prefix_reuse``), so a larger pool keeps more
    conversations' prefixes."""
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)
    """Sizes a prefill call pads its prompt chunk to (one compilation per bucket, made once). A prompt is
    prefilled in a sequence of bucket-sized chunks chosen for its length (``prefill_chunks``): a 288-token
    prompt runs as 256 + 32, not padded to 512."""
    prefill_call_cost: int = 32
    """What one more prefill call costs, in prompt tokens (the device's fixed cost per call, e.g. reading
    the weights once): a prompt is split into one more chunk only when that saves more padding than this, and
    a cached prefix (``prefix_reuse``) is reused only when it covers more prompt tokens than this."""
    mode: str = "continuous"
    """``continuous``: requests join free slots between decode steps and leave the moment they finish.
    ``static``: a batch is admitted only when every slot is free, decodes until its longest request
    finishes, and all its completions are returned together (the baseline to compare against)."""
    prefix_reuse: bool = True
    """Keep a finished request's keys/values in the KV pool's free blocks, in a prefix cache keyed by token
    content: a later prompt that extends them (the next turn of a conversation, in whatever slot it lands)
    prefills only the new tokens, and prompts sharing whole blocks of a prefix read the same blocks. Cached
    blocks are evicted, least recently used first, only when admission needs them; weight swaps clear the
    cache. The reused rows were computed in other prefill chunks, so logits can differ from a fresh prefill
    by float rounding (as they do between batch sizes): "the same seed gives the same tokens whatever ran
    before" holds up to rounding. False prefills every prompt in full."""
    fixed_shapes: bool = False
    """Run every decode step over all slots and the whole context, and every batched prefill over all slots: one
    decode program and one prefill program per prompt bucket. A request's numbers then never depend on what
    shares its call (a smaller row bucket or a shorter span is another compiled program, whose rounding differs
    in the last bits and now and then flips a sampled token), at the price of computing the padding. For
    reproducible runs (``rollout.mode: lockstep`` requires it); off, a call's cost follows what it holds."""
    decode_steps: int | None = None
    """Decode steps one device call runs (a loop on the device; stop ids, ``max_new_tokens`` and the context
    are checked inside it), between which the host admits and retires requests. More steps spread the host's
    fixed cost per call (planning, dispatch, reading results) over more tokens; a row that ends early idles for
    the rest of its call. None picks by platform (``steps_per_call``): 1 on CPU, where each step's compute
    dwarfs the host's work, ``ACCELERATOR_DECODE_STEPS`` on an accelerator."""
    max_stop_ids: int = 8
    """Most stop ids one request may give (the decode loop compares each sampled token with a fixed-width row
    of them); a request with more is refused, naming this field."""
    close_timeout_s: float = 60.0
    """How long ``close()`` waits for the compute step in flight before giving up."""
    kind: str = "jax"
    """Which engine serves rollouts: ``jax`` (built in, uses the fields above) or ``vllm`` (uses ``vllm`` and
    ``max_seq_len``)."""
    vllm: VllmConfig = field(default_factory=VllmConfig)
    """The vLLM backend, when ``kind`` is ``vllm``."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Devices the ``jax`` engine serves on (default one): ``tensor`` splits every layer's heads and MLP and the
    KV cache's kv heads over devices, so a model too large for one device serves across several."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_slots <= MAX_SLOTS:
            raise ValueError(f"EngineConfig.num_slots must be in [1, {MAX_SLOTS}], got {self.num_slots}")
        if self.max_seq_len < 2:
            raise ValueError(f"EngineConfig.max_seq_len must be >= 2, got {self.max_seq_len}")
        if not self.prefill_buckets:
            raise ValueError("EngineConfig.prefill_buckets must not be empty")
        if list(self.prefill_buckets) != sorted(set(self.prefill_buckets)) or self.prefill_buckets[0] < 1:
            raise ValueError(
                f"EngineConfig.prefill_buckets must be strictly increasing positive ints, got {self.prefill_buckets}"
            )
        if self.prefill_buckets[-1] > self.max_seq_len:
            raise ValueError(
                f"EngineConfig.prefill_buckets has {self.prefill_buckets[-1]} > max_seq_len={self.max_seq_len}"
            )
        if self.prefill_call_cost < 0:
            raise ValueError(f"EngineConfig.prefill_call_cost must be >= 0, got {self.prefill_call_cost}")
        if self.mode not in MODES:
            raise ValueError(f"EngineConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.block_size < 1:
            raise ValueError(f"EngineConfig.block_size must be >= 1, got {self.block_size}")
        if self.num_blocks not in (None, "auto") and self.num_blocks < self.blocks_per_sequence:
            raise ValueError(
                f"EngineConfig.num_blocks={self.num_blocks} cannot hold one sequence of max_seq_len="
                f"{self.max_seq_len} ({self.blocks_per_sequence} blocks of {self.block_size})"
            )
        if self.decode_steps is not None and self.decode_steps < 1:
            raise ValueError(f"EngineConfig.decode_steps must be >= 1 or null (by platform), got {self.decode_steps}")
        if self.max_stop_ids < 1:
            raise ValueError(f"EngineConfig.max_stop_ids must be >= 1, got {self.max_stop_ids}")
        if self.close_timeout_s <= 0:
            raise ValueError(f"EngineConfig.close_timeout_s must be > 0, got {self.close_timeout_s}")
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"EngineConfig.kind must be one of {ENGINE_KINDS}, got {self.kind!r}")

    @classmethod
    def tiny(cls) -> EngineConfig:
        """Small slots and buckets for the tiny model on CPU."""
        return cls(num_slots=4, max_seq_len=128, prefill_buckets=(16, 32, 64))

    @property
    def blocks_per_sequence(self) -> int:
        return -(-self.max_seq_len // self.block_size)

    @property
    def pool_blocks(self) -> int:
        """``num_blocks``, or enough for every slot at full length."""
        if self.num_blocks == "auto":
            raise ValueError("EngineConfig.num_blocks='auto' is sized by a colocated campaign's memory plan "
                             "(pipelines_lib.memplan, run by run_colocated); give a number of blocks here")
        return self.num_blocks if self.num_blocks is not None else self.num_slots * self.blocks_per_sequence

    @property
    def attention_spans(self) -> tuple[int, ...]:
        """Block counts a decode step may attend over (one compilation each, per row bucket): powers of two
        covering at least ``MIN_SPAN_POSITIONS`` and below ``blocks_per_sequence``, then it. A step attends over
        at most twice what its longest sequence holds, and the count grows with log2 of the context."""
        first = -(-MIN_SPAN_POSITIONS // self.block_size)
        spans = [] if self.fixed_shapes else [1 << i for i in range(self.blocks_per_sequence.bit_length())
                                              if first <= 1 << i < self.blocks_per_sequence]
        return (*spans, self.blocks_per_sequence)

    @property
    def row_buckets(self) -> tuple[int, ...]:
        """Batch sizes a decode step or a batched prefill runs with (one compilation each, per span or bucket):
        powers of four below ``num_slots``, then it. A step runs the smallest one holding its rows, so its cost
        follows the slots occupied (padded at most fourfold), with few variants: 64 slots give 1, 4, 16, 64."""
        rows = [] if self.fixed_shapes else [4**i for i in range(self.num_slots.bit_length()) if 4**i < self.num_slots]
        return (*rows, self.num_slots)

    @property
    def decode_variants(self) -> int:
        """Decode programs compiled: one per row bucket and attention span."""
        return len(self.row_buckets) * len(self.attention_spans)

    @property
    def prefill_variants(self) -> int:
        """Prefill programs compiled: one per prompt bucket and row bucket (a single row attends over its whole
        table row, so a first chunk and a later one share it)."""
        return len(self.prefill_buckets) * len(self.row_buckets)

    def steps_per_call(self, platform: str) -> int:
        """``decode_steps``, or its default for devices of ``platform`` (``jax.Device.platform``)."""
        if self.decode_steps is not None:
            return self.decode_steps
        return 1 if platform == "cpu" else ACCELERATOR_DECODE_STEPS

    def rows_for(self, n: int) -> int:
        """Smallest row bucket holding ``n`` rows."""
        return next(r for r in self.row_buckets if r >= n)

    def span_for(self, positions: int) -> int:
        """Smallest attention span (in blocks) covering ``positions`` positions."""
        blocks = -(-positions // self.block_size)
        return next(s for s in self.attention_spans if s >= blocks)

    def bucket_for(self, length: int) -> int:
        """Smallest bucket holding ``length`` tokens (the largest one when none does)."""
        return next((b for b in self.prefill_buckets if b >= length), self.prefill_buckets[-1])

    def prefill_chunks(self, length: int) -> tuple[int, ...]:
        """Buckets of the prefill calls covering ``length`` prompt tokens, in order (only the last one padded).

        Chunks of the largest bucket while more remains, then the cheaper of padding the rest to one bucket
        or splitting off the largest bucket below it and planning what is left, at ``bucket +
        prefill_call_cost`` per call: with buckets up to 512, 288 tokens run as 256 + 32 (cost 352, against 544
        for one padded 512), 500 as one 512."""
        largest = self.prefill_buckets[-1]
        full, rest = divmod(max(length, 0), largest)
        return (largest,) * full + (self._plan_rest(rest)[1] if rest else ())

    def _plan_rest(self, length: int) -> tuple[int, tuple[int, ...]]:
        """(cost, buckets) of the cheaper plan for ``0 < length <= largest bucket`` tokens (see ``prefill_chunks``)."""
        whole = self.bucket_for(length)
        best = (whole + self.prefill_call_cost, (whole,))
        below = [b for b in self.prefill_buckets if b < length]
        if below:
            cost, rest = self._plan_rest(length - below[-1])
            if below[-1] + self.prefill_call_cost + cost < best[0]:
                best = (below[-1] + self.prefill_call_cost + cost, (below[-1], *rest))
        return best
