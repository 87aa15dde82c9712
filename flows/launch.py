"""Start a stage and get its manifest back, either in this process or as a deployment run on a work pool.

```
in-process (embedded default)          use_deployments=True (production)
  task.submit(...) on the flow's          run_stage_deployment.submit(...)  (a thread of the flow)
  ThreadPoolTaskRunner                      └ run_deployment("rollstream-<stage>/<stage>", job_variables=
  └ pipelines_lib stage function                resources_for(stage).job_variables())  -> a worker's job
                                              └ the stage flow (flows/stages.py) -> the same task
                                            manifest <- runs/<key>-<child flow run id>.json
```

A deployment run happens in another process, often on another machine, so its manifest comes back through
the campaign folder (the run record its task wrote), not through Prefect's result storage: the stages stay
coupled only through the folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.deployments import run_deployment
from prefect.futures import PrefectFuture

from pipelines_lib.config import CampaignConfig
from pipelines_lib.records import RunRecord
from pipelines_lib.settings import Settings
from pipelines_lib.stages.table import STAGES, resources_for
from tasks.audit import audit
from tasks.collect_rollouts import collect_rollouts
from tasks.common import open_store, stage_key
from tasks.evaluate import evaluate_version
from tasks.prep import prep_dataset
from tasks.train import train
from tasks.warm_start import warm_start

STAGE_TASKS = {"prep": prep_dataset, "warm_start": warm_start, "collect": collect_rollouts, "train": train,
               "evaluate": evaluate_version, "audit": audit}
"""Stage -> its Prefect task; the keys are the stage table's names (``tests/test_stage_table.py``)."""
DEPLOYMENTS = {s.name: s.deployment for s in STAGES}
"""Stage -> ``<flow name>/<deployment name>`` as ``infra/prefect.yaml`` declares them."""


class StageRunFailed(RuntimeError):
    """A stage's deployment run ended in a state other than Completed."""


class StageRunCrashed(StageRunFailed):
    """A stage's deployment run ended Crashed: its process is gone (Prefect's zombie automation says so when its
    heartbeats stop), not its code; the orchestrating flow then ends Crashed too, which the heal trigger answers."""


@task(name="run-deployment", task_run_name="{key}")
def run_stage_deployment(stage: str, key: str, parameters: dict[str, Any], job_variables: dict[str, Any],
                         settings: Settings) -> dict[str, Any]:
    """Run one stage deployment to its end (the child flow run is linked under this task in the UI)."""
    run = run_deployment(DEPLOYMENTS[stage], parameters=parameters, job_variables=job_variables, timeout=None)
    if run.state is None or not run.state.is_completed():
        state = run.state.name if run.state else "unknown"
        raise (StageRunCrashed if run.state and run.state.is_crashed() else StageRunFailed)(f"{key}: flow run {run.name} ({run.id}) of {DEPLOYMENTS[stage]} ended {state}: "
                             f"{run.state.message if run.state else ''}")
    store = open_store(parameters["campaign_url"], parameters.get("storage_options"), settings)
    manifest = RunRecord.read(store, key, str(run.id)).manifest
    if manifest is None:
        raise StageRunFailed(f"{key}: flow run {run.name} ({run.id}) completed without a manifest in its run record")
    return manifest


@dataclass(frozen=True, kw_only=True)
class Launcher:
    campaign_url: str
    config: CampaignConfig
    storage_options: dict[str, Any] | None = None
    settings: Settings
    """The entry point's settings, handed to in-process stages (a deployment run's flow reads its own)."""
    use_deployments: bool = False

    def submit(self, stage: str, **params: Any) -> PrefectFuture[dict[str, Any]]:
        """Start ``stage``; ``.result()`` on the future is its manifest (and raises if it failed)."""
        parameters = {"campaign_url": self.campaign_url, "storage_options": self.storage_options, **params}
        if not self.use_deployments:
            return STAGE_TASKS[stage].submit(**parameters, settings=self.settings)
        key = stage_key(stage, worker_index=params.get("worker_index"), version=params.get("version"))
        resources = resources_for(stage, self.config, worker_index=params.get("worker_index", 0))
        return run_stage_deployment.submit(stage, key, parameters, resources.job_variables(), self.settings)
