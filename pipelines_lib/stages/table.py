"""The stage table: the one declaration of the campaign's stages, in run order.

```
Stage(name, done_marker, pool, resources, retries)
  done_marker  the marker record that says it is done: a retry or recovery that finds it skips the stage
               (None: never done; the audit is done once a record exists and every other stage is done)
  pool         the work pool its deployment runs on; resources sizes one run from the campaign config
  retries      task-level retries of failures worth retrying (after the store's own, seconds-scale ones)
```
The Prefect flows and tasks, the launcher's deployment names, ``campaign_status`` (and so the recover flow) and
``infra/prefect.yaml`` all follow it (``tests/test_stage_table.py`` checks the last one). Adding a stage is one
entry here plus its function (``pipelines_lib.stages.<name>``), its task and its flow.

The table imports no stage function and no model code: ``rollstream status`` reads it, and must not load JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines_lib import records
from pipelines_lib.records import CampaignManifest, DatasetSuccess, DoneMarker, Publication
from pipelines_lib.stages.resources import (
    ACCEL_POOL,
    CPU_POOL,
    Resources,
    collect_resources,
    cpu_light,
    evaluate_resources,
    train_resources,
    warm_start_resources,
)
from pipelines_lib.storage import layout
from pipelines_lib.storage.store import Store

if TYPE_CHECKING:
    from pipelines_lib.config import CampaignConfig


def _evaluated(store: Store) -> bool:
    # Evaluation is done once training is, and every version the campaign's ``eval.versions`` asks for (all
    # published ones, or the ends) has its EvalResult.
    if not DoneMarker.exists(store):
        return False
    choice = CampaignManifest.read(store).eval_versions if store.exists(CampaignManifest.PATH) else "all"
    wanted = records.versions_to_evaluate(records.published_versions(store), choice)
    return set(wanted) <= set(records.evaluated_versions(store))


def _audited(store: Store) -> bool:
    # An audit is a snapshot: the campaign is audited once an audit record exists and every other stage is done
    # (the campaign flow audits last, so that record saw the finished folder).
    return any(n.endswith(".json") for n in store.list(layout.AUDIT)) and all(
        s.done(store) for s in STAGES if s.name != "audit")


@dataclass(frozen=True, kw_only=True)
class Stage:
    name: str
    done_marker: Callable[[Store], bool] | None
    pool: str
    resources: Callable[..., Resources]
    retries: int = 3

    @property
    def flow_name(self) -> str:
        return f"rollstream-{self.name.replace('_', '-')}"

    @property
    def deployment(self) -> str:
        """``<flow name>/<deployment name>``, as ``infra/prefect.yaml`` declares it."""
        return f"{self.flow_name}/{self.name.replace('_', '-')}"

    def done(self, store: Store) -> bool:
        return self.done_marker is not None and self.done_marker(store)


STAGES: tuple[Stage, ...] = (
    Stage(name="prep", done_marker=lambda s: s.exists(DatasetSuccess.PATH), pool=CPU_POOL,
          resources=cpu_light),
    Stage(name="warm_start", done_marker=lambda s: Publication.exists(s, 0),
          pool=ACCEL_POOL, resources=warm_start_resources),
    Stage(name="collect", done_marker=DoneMarker.exists, pool=ACCEL_POOL,
          resources=collect_resources),
    Stage(name="train", done_marker=DoneMarker.exists, pool=ACCEL_POOL, resources=train_resources),
    Stage(name="evaluate", done_marker=_evaluated, pool=CPU_POOL,
          resources=evaluate_resources),
    Stage(name="audit", done_marker=_audited, pool=CPU_POOL, resources=cpu_light),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}


def stage(name: str) -> Stage:
    """The table's entry for ``name``; an unknown name is refused with the valid ones."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown stage {name!r}; valid: {STAGE_NAMES}")
    return _BY_NAME[name]


def resources_for(name: str, config: CampaignConfig, *, worker_index: int = 0, accelerator: str = "H100",
                  topology: str | None = None) -> Resources:
    """What one run of stage ``name`` needs on ``accelerator`` chips (a name of ``resources.ACCELERATORS``), on a
    slice of ``topology`` when given (``4x4``; a GPU count), else on the smallest slice that holds it."""
    return stage(name).resources(config, worker_index=worker_index, accelerator=accelerator, topology=topology)


__all__ = ["STAGES", "STAGE_NAMES", "Stage", "resources_for", "stage"]
