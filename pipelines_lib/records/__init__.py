"""Typed records: every object in the campaign folder other than a shard, with one writer and one reader each.

```
record              path (storage/layout)                          written by
CampaignManifest    campaign.json                                   campaign.init_campaign, demo, fork
DatasetSuccess      dataset/_SUCCESS                                dataset.prep
ConsumptionLog      train/consumed/<step:08d>.json                  train.trainer (the write-ahead log)
CheckpointMeta      train/checkpoints/<step:08d>[.n]/meta.json      train.checkpoint.save_checkpoint
Publication         weights/v<N:08d>/PUBLISHED.json, and each       publish.publish_weights
                    entry of the weights/LATEST pointer
EvalResult          eval/v<N:08d>.json                              evaluate.evaluate
DoneMarker          train/DONE.json                                 train.trainer
StopRequest         rollout/STOP-<utc>.json                         stages.stopping.request_stop
RunRecord           runs/<key>-<flow_run_id>[-failed-<n>].json      tasks.common.stage_run
HealAttempt         heal/<attempt:04d>.json                         stages.campaign.claim_heal_attempt
AuditRecord         audit/<utc>.json (+ .txt)                       tasks.audit (an ``audit.AuditReport``)
AuditVersionResult  audit/versions/v<N>-<digest>-<newest>.json      audit.campaign (one version folder's result)
```

Each record is a frozen dataclass. Its path comes from ``layout`` in one place: ``PATH`` for an object the
folder holds once, ``path_of(*key)`` for one of many, named by its ``KEY`` fields (a consumption log by ``step``,
an eval result or a publication by ``version``). ``write(store)`` is its only way into the folder (create-only,
so a second writer of the same object gets ``AlreadyExistsError``); ``read(store, *key)`` (or ``at(store, path)``
for a listed path) is the only way out, ``exists(store, *key)`` its done check, and
``from_json`` checks every field's type and the record version, naming the object and the bad field on error
(``RecordError``). Each JSON object carries ``record_version``; a reader refuses versions it does not know.
Listing helpers (``consumption_steps``, ``published_versions``, ``evaluated_versions``, ``run_records``) parse
names through ``layout``, so no other module knows how the folder spells a step or a version.
``with_parents`` opens a fork (``campaign.json`` names a ``parent``) over its parents' history.

The mechanism is in ``base`` (``Record``, ``RecordError``); the records are declared by area, in ``campaign``
(campaign.json, dataset marker, forks), ``train``, ``weights``, ``evaluate``, ``runs`` (run records, stop
requests) and ``audit``. This package is the one import every reader and writer uses
(``from pipelines_lib.records import ConsumptionLog``), whichever module declares the record.
"""

from pipelines_lib.records.audit import AuditRecord, AuditVersionResult, audit_version_results, newest_audit
from pipelines_lib.records.base import RECORD_VERSION_KEY, Record, RecordError
from pipelines_lib.records.campaign import (
    CampaignManifest,
    DatasetSuccess,
    ForkLineageError,
    ForkLoopError,
    ForkParent,
    SplitInfo,
    fork_chain,
    read_folders,
    with_parents,
)
from pipelines_lib.records.evaluate import EvalResult, evaluated_versions, versions_to_evaluate
from pipelines_lib.records.runs import HealAttempt, RunRecord, StopRequest, heal_attempts, run_records
from pipelines_lib.records.train import (
    CheckpointMeta,
    ConsumedGroup,
    ConsumptionLog,
    DoneMarker,
    DroppedStale,
    SkippedShard,
    ZeroAdvantageGroup,
    committed_checkpoints,
    consumption_logs,
    consumption_steps,
)
from pipelines_lib.records.weights import Publication, published_versions

__all__ = [
    "RECORD_VERSION_KEY",
    "AuditRecord",
    "AuditVersionResult",
    "CampaignManifest",
    "CheckpointMeta",
    "ConsumedGroup",
    "ConsumptionLog",
    "DatasetSuccess",
    "DoneMarker",
    "DroppedStale",
    "EvalResult",
    "ForkLineageError",
    "ForkLoopError",
    "ForkParent",
    "HealAttempt",
    "Publication",
    "Record",
    "RecordError",
    "RunRecord",
    "SkippedShard",
    "SplitInfo",
    "StopRequest",
    "ZeroAdvantageGroup",
    "audit_version_results",
    "committed_checkpoints",
    "consumption_logs",
    "consumption_steps",
    "evaluated_versions",
    "versions_to_evaluate",
    "fork_chain",
    "read_folders",
    "heal_attempts",
    "newest_audit",
    "published_versions",
    "run_records",
    "with_parents",
]
