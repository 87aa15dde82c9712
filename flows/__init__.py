"""Prefect flows over the stage tasks. The only layer that reads the environment or talks to Prefect's API.

```
flows/campaign.py   campaign: init -> prep -> warm start (v0) -> N rollout workers || streaming trainer
                    -> evaluate published versions -> audit; artifacts (eval tables, learning curve, audit)
flows/stages.py     one flow per stage (deployable alone); the campaign flow reaches them via run_deployment
flows/recover.py    campaign_status -> run only the stages that are missing or partial
flows/params.py     the campaign flow's typed overrides: a pydantic model generated from the config dataclasses
flows/launch.py     a stage in-process (task .submit) or as a deployment run; run records link the two
flows/monitor.py    progress of a running campaign read from its folder (terminal + progress artifacts)
flows/artifacts.py  evaluation tables, the learning-curve PNG, the audit summary
flows/replay.py     one logged training step recomputed from storage (as run, or under a what-if)
flows/fork.py       a new campaign from a step of another (referencing its history), then optionally recover on it
```
Which stages exist, their order, pools, sizing and retries come from the stage table
(``pipelines_lib.stages.table``).
"""

import functools
import os
from typing import Any

from pipelines_lib.settings import Settings, apply_process_defaults

# Before any ``flows`` module imports Prefect: Prefect reads its settings from the environment once, when ``prefect``
# is first imported (``prefect.context``'s global settings), so a default set later (say in ``main``) is in
# ``os.environ`` but not in Prefect's settings. ``python -m flows.campaign``, ``python -m flows.recover`` and the
# stage flows all import this package first.
apply_process_defaults(os.environ)


@functools.cache
def settings() -> Settings:
    """This process's ``Settings``, read from the environment once (the flows are an entry point)."""
    return Settings.from_env(os.environ)


def entry(campaign_url: str, storage_options: dict[str, Any] | None) -> Settings:
    """What every flow does first: this process's settings, with Orbax's GCS clients pointed at the campaign's
    endpoint (``Settings.orbax_environment``; stage tasks in this process or its process pool inherit it)."""
    os.environ.update(Settings.orbax_environment(campaign_url, storage_options))
    return settings()
