"""The campaign's page with the campaign's own parts: ``audit.view.build_view`` given the tokenizer its trajectories
were tokenized with and the trainer's advantage estimator, both named by ``campaign.json``.

The tokenizer is the config's ``tokenizer`` folder (the embedded default, built under ``cache`` if missing, when it
is None), opened as the collect stage opens it; each trajectory is decoded only if its recorded ``tokenizer_hash``
is that tokenizer's. A folder that is not a training campaign (``rollstream demo``'s synthetic one), or whose
tokenizer folder is not on this machine, gets a page of token ids that says why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipelines_lib.audit.view import DEFAULT_MAX_GROUPS, View, ViewParts, build_view, write_view
from pipelines_lib.config import CampaignConfig
from pipelines_lib.model.tokenizer import open_tokenizer
from pipelines_lib.records import CampaignManifest
from pipelines_lib.storage.store import Store


def _advantages(estimator: str, rewards_gk: np.ndarray) -> np.ndarray:
    from pipelines_lib.train.advantages import compute_advantages  # jax: only when a page is built

    return np.asarray(compute_advantages(rewards_gk, estimator=estimator)[0])


def view_parts(store: Store, *, cache: Path | None = None) -> ViewParts:
    """The tokenizer and advantage estimator of the campaign at ``store`` (see the module docstring)."""
    manifest = CampaignManifest.read(store) if store.exists(CampaignManifest.PATH) else None
    if manifest is None or manifest.kind != "campaign":
        kind = "no campaign.json" if manifest is None else f"a {manifest.kind} folder"
        return ViewParts(tokenizer_note=f"{kind}: no tokenizer or advantage estimator is named")
    config = CampaignConfig.from_mapping(manifest.config)
    estimator = config.trainer.advantage
    advantages = functools.partial(_advantages, estimator)
    if config.tokenizer is not None and not Path(config.tokenizer).is_dir():
        return ViewParts(
            tokenizer_note=f"the campaign's tokenizer folder {config.tokenizer} is not on this machine",
            advantage=estimator,
            advantages=advantages,
        )
    return ViewParts(
        tokenizer=open_tokenizer(config.tokenizer, cache=cache), advantage=estimator, advantages=advantages
    )


def campaign_view(
    store: Store,
    *,
    max_groups: int = DEFAULT_MAX_GROUPS,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> View:
    """``build_view`` with ``view_parts``: what ``rollstream view`` and the campaign flow write."""
    return build_view(store, max_groups=max_groups, progress=progress, parts=view_parts(store, cache=cache))


def write_campaign_view(store: Store, *, cache: Path | None = None) -> str:
    """``campaign_view`` committed into the campaign as ``view/<utc>/`` (the report and its learning curve, what
    the campaign flow leaves when it ends); the report's path."""
    return write_view(store, campaign_view(store, cache=cache))
