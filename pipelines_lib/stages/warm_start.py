"""The warm-start stage: a version-0 policy, trained on demonstrations or imported, then published.

```
warm_start(store, config)
  weights/v00000000 published already?  -> its manifest, nothing else happens
  config.init_from = HF folder           -> model.hf_import.load_hf_checkpoint
  config.init_from = campaign URL        -> that campaign's LATEST weights
  otherwise (SFT, train.sft):            demonstrations from the env's generator, config.sft steps of nll
  -> publish_weights(version=0, step=0)
```

Initialisation is seeded by ``sft.seed``. Demonstrations longer than the model's context are left out and
counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from pipelines_lib import telemetry
from pipelines_lib.agents import AGENT_REGISTRY
from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.hf_import import load_hf_checkpoint
from pipelines_lib.model.tokenizer import open_tokenizer, tokenizer_dir
from pipelines_lib.publish import load_published, publish_weights
from pipelines_lib.records import Publication, with_parents
from pipelines_lib.storage.store import Store
from pipelines_lib.train.sft import demonstration_rows, sft_train


def is_hf_folder(init_from: str) -> bool:
    """Whether ``init_from`` names a local Hugging Face checkpoint folder (else another campaign's URL)."""
    return "://" not in init_from and (Path(init_from) / "config.json").is_file()


def _import_weights(init_from: str, store: Store, dtype: str) -> tuple[Decoder, dict[str, Any]]:
    if is_hf_folder(init_from):
        # In the campaign's model dtype: the engines take the trainer's publications (in its compute dtype) in
        # place of version 0, so version 0 is published in it too.
        return load_hf_checkpoint(init_from, dtype=dtype), {"source": "hf", "init_from": init_from}
    # Another campaign; on the same backend it is reached with the same credentials/endpoint as ours.
    model, version = load_published(store.other(init_from))
    return model, {"source": "campaign", "init_from": init_from, "from_version": version}


def warm_start(store: Store, config: CampaignConfig, *, cache: Path | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Publish version 0 (see the module docstring); a no-op returning its manifest if it is published.
    ``cache`` is the process's cache folder (``Settings.cache``)."""
    store = with_parents(store)  # a fork's version 0 is its parent's
    if Publication.exists(store, 0):
        return {**Publication.read(store, 0).to_dict(), "skipped": True}
    with telemetry.recording(store, "warm_start"), telemetry.span("stage.warm_start", track="stage"):
        started = time.perf_counter()
        if config.init_from is not None:
            model, info = _import_weights(config.init_from, store, config.model.dtype)
        else:
            tokenizer = open_tokenizer(config.tokenizer, cache=cache)
            if tokenizer.vocab_size > config.model.vocab_size:
                raise ValueError(
                    f"tokenizer has {tokenizer.vocab_size} ids but model.vocab_size is {config.model.vocab_size}"
                )
            sft = config.sft
            tokens, masks = demonstration_rows(
                config.env,
                tokenizer,
                n=sft.n_demos,
                error_rate=sft.error_rate,
                seed=sft.seed,
                with_tools=AGENT_REGISTRY[config.agent.kind].uses_tools,
            )
            keep = [i for i, row in enumerate(tokens) if len(row) <= config.model.max_seq_len]
            rows = [tokens[i] for i in keep], [masks[i] for i in keep]
            model = Decoder(config.model, rngs=nnx.Rngs(sft.seed))
            log(
                f"sft: {len(keep)} demonstrations (longest {max(map(len, rows[0]))} tokens, "
                f"{len(tokens) - len(keep)} too long), {sft.steps} steps of {sft.batch_size} on {jax.default_backend()}"
            )
            info = {
                "source": "sft",
                "demos": len(keep),
                "demos_too_long": len(tokens) - len(keep),
                **sft_train(
                    model, rows, sft, pad_id=tokenizer.pad_id, log=log, log_every=max(1, min(25, sft.steps // 6))
                ),
            }
        manifest = publish_weights(store, model, version=0, step=0,
                                   tokenizer_dir=tokenizer_dir(config.tokenizer, cache=cache))
    return {**manifest, **info, "wall_s": time.perf_counter() - started, "skipped": False}


__all__ = ["is_hf_folder", "warm_start"]
