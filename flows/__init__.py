"""Prefect flows over the stage tasks. The only layer that reads the environment or talks to Prefect's API.

```
flows/campaign.py   campaign: init -> prep -> warm start (v0) -> N rollout workers || streaming trainer
                    -> evaluate published versions -> audit; artifacts (eval tables, learning curve, audit)
flows/stages.py     one flow per stage (deployable alone); the campaign flow reaches them via run_deployment
flows/recover.py    campaign_status -> run only the stages that are missing or partial
flows/launch.py     a stage in-process (task .submit) or as a deployment run; run records link the two
flows/monitor.py    progress of a running campaign read from its folder (terminal + progress artifacts)
flows/artifacts.py  evaluation tables, the learning-curve PNG, the audit summary
```
Which stages exist, their order, pools, sizing and retries come from the stage table
(``pipelines_lib.stages.table``).
"""

import os

ENVIRONMENT_DEFAULTS = {
    # Prefect's ephemeral API server takes 10+ s to start on a busy 2-core machine; its default wait is 20 s.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # gcsfs probes for zonal buckets over gRPC, which stalls 30-100 s against emulators and private endpoints.
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    # No phoning home: the only network a campaign uses is its storage.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # tensorstore (Orbax) sets no request timeout: a stalled GCS request would wait for TCP to give up.
    "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "1",
}


def configure_environment() -> None:
    """Defaults the entry points need before Prefect or gcsfs start (explicit settings win).

    Runs when this package is imported, before any ``flows`` module imports Prefect: Prefect reads its settings
    from the environment once, when ``prefect`` is first imported (``prefect.context``'s global settings), so a
    default set later (say in ``main``) is in ``os.environ`` but not in Prefect's settings. ``python -m
    flows.campaign``, ``python -m flows.recover`` and the stage flows all import this package first."""
    for key, value in ENVIRONMENT_DEFAULTS.items():
        os.environ.setdefault(key, value)


configure_environment()
