"""The prep stage: the campaign's dataset splits under ``dataset/``, once (``dataset.prep`` with its section and
its env, whose options shape a built-in source's tasks)."""

from __future__ import annotations

from typing import Any

from pipelines_lib.config import CampaignConfig
from pipelines_lib.dataset import prep as prep_dataset
from pipelines_lib.records import with_parents
from pipelines_lib.storage.store import Store


def prep(store: Store, config: CampaignConfig, *, source_storage_options: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    """``source_storage_options`` open the source when it is a URL (e.g. another bucket); returns the manifest."""
    return prep_dataset(with_parents(store), config.dataset, storage_options=source_storage_options, env=config.env)


__all__ = ["prep"]
