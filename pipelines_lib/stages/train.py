"""The train stage: the streaming GRPO trainer over a campaign, to ``trainer.max_steps`` and its done marker.

A rerun is a resume, not a redo: the trainer restores its newest checkpoint, replays the logged steps after it
and continues with the same cursor (``train.trainer``). A finished run returns its ``DoneMarker``; a stopped one
(``stages.stopping``) its summary so far, ``stopped`` true.
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
from pipelines_lib.rollout.collect import utc_compact
from pipelines_lib.stages.stopping import should_stop
from pipelines_lib.storage.store import Store
from pipelines_lib.train.trainer import StreamingTrainer


def trainer_for(store: Store, config: CampaignConfig, *, cache: Path | None = None,
                on_publish: Callable[[int, Decoder], None] | None = None,
                on_published: Callable[[int], None] | None = None,
                abort: Callable[[], BaseException | None] | None = None,
                should_stop: Callable[[], bool] | None = None,
                log: Callable[[str], None] = print) -> StreamingTrainer:
    """The campaign's trainer: its own section, plus the two rollout bounds it shares (η, group size) and the
    tokenizer its publications carry (the default one built under ``cache``, ``Settings.cache``);
    ``on_publish``, ``on_published``, ``abort`` and ``should_stop`` as ``StreamingTrainer`` takes them."""
    return StreamingTrainer(store, config.trainer, eta=config.rollout.eta, group_size=config.rollout.group_size,
                            tokenizer_dir=tokenizer_dir(config.tokenizer, cache=cache), on_publish=on_publish,
                            on_published=on_published, abort=abort, should_stop=should_stop, log=log)


def train(
    store: Store, config: CampaignConfig, *, max_steps: int | None = None, cache: Path | None = None,
    process_id: int | None = None, on_publish: Callable[[int, Decoder], None] | None = None,
    on_published: Callable[[int], None] | None = None, abort: Callable[[], BaseException | None] | None = None,
    log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Resume, train to ``max_steps`` (default: ``trainer.max_steps``), mark done; returns the summary.

    A trainer spanning hosts runs this in one process per host: ``config.distributed`` (``process_id`` overrides its
    ``process_id``) joins them before anything touches JAX, and process 0 alone records telemetry. ``on_publish`` hands
    each published model to an engine in this process and ``on_published`` says when the pointer names it, ``abort``
    says when the process's rollout workers have failed (colocated placement). A stop signal to this process, or a stop
    request of the campaign newer than this call (``stages.stopping``), ends it at its next step boundary, without the
    done marker."""
    initialize(config.distributed, process_id=process_id)
    if DoneMarker.exists(store):
        return DoneMarker.read(store).to_dict()
    started = utc_compact()
    with telemetry.recording(store if is_writer() else None, "trainer"):
        trainer = trainer_for(store, config, cache=cache, on_publish=on_publish, on_published=on_published,
                              abort=abort, should_stop=lambda: should_stop(store, since=started), log=log)
        trainer.restore()
        return trainer.run(max_steps)


__all__ = ["train", "trainer_for"]
