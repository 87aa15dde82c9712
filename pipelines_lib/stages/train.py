"""The train stage: the streaming GRPO trainer over a campaign, to ``trainer.max_steps`` and its done marker.

A rerun is a resume, not a redo: the trainer restores its newest checkpoint, replays the logged steps after it
and continues with the same cursor (``train.trainer``). A finished run returns its ``DoneMarker``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines_lib import telemetry
from pipelines_lib.config import CampaignConfig
from pipelines_lib.distributed import initialize, is_writer
from pipelines_lib.model.decoder import Decoder
from pipelines_lib.model.tokenizer import tokenizer_dir
from pipelines_lib.records import DoneMarker
from pipelines_lib.storage.store import Store
from pipelines_lib.train.trainer import StreamingTrainer


def trainer_for(store: Store, config: CampaignConfig, *, cache: Path | None = None,
                on_publish: Callable[[int, Decoder], None] | None = None,
                abort: Callable[[], BaseException | None] | None = None,
                log: Callable[[str], None] = print) -> StreamingTrainer:
    """The campaign's trainer: its own section, plus the two rollout bounds it shares (η, group size) and the
    tokenizer its publications carry (the default one built under ``cache``, ``Settings.cache``);
    ``on_publish`` and ``abort`` as ``StreamingTrainer`` takes them."""
    return StreamingTrainer(store, config.trainer, eta=config.rollout.eta, group_size=config.rollout.group_size,
                            tokenizer_dir=tokenizer_dir(config.tokenizer, cache=cache), on_publish=on_publish,
                            abort=abort, log=log)


def train(
    store: Store, config: CampaignConfig, *, max_steps: int | None = None, cache: Path | None = None,
    process_id: int | None = None, on_publish: Callable[[int, Decoder], None] | None = None,
    abort: Callable[[], BaseException | None] | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Resume, train to ``max_steps`` (default: ``trainer.max_steps``), mark done; returns the summary.

    A trainer spanning hosts runs this in one process per host: ``config.distributed`` (``process_id`` overrides
    its ``process_id``) joins them before anything touches JAX, and process 0 alone records telemetry.
    ``on_publish`` hands each published model to an engine in this process, ``abort`` says when the process's
    rollout workers have failed (colocated placement)."""
    initialize(config.distributed, process_id=process_id)
    if DoneMarker.exists(store):
        return DoneMarker.read(store).to_dict()
    with telemetry.recording(store if is_writer() else None, "trainer"):
        trainer = trainer_for(store, config, cache=cache, on_publish=on_publish, abort=abort, log=log)
        trainer.restore()
        return trainer.run(max_steps)


__all__ = ["train", "trainer_for"]
