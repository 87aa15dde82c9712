"""Prefect flows over the stage tasks. The only layer that reads the environment or talks to Prefect's API.

```
flows/campaign.py   campaign: init -> prep -> warm start (v0) -> N rollout workers || streaming trainer
                    -> evaluate published versions -> audit; artifacts (eval tables, learning curve, audit)
flows/stages.py     one flow per stage (deployable alone); the campaign flow reaches them via run_deployment
flows/recover.py    campaign_status -> run only the stages that are missing or partial
flows/launch.py     a stage in-process (task .submit) or as a deployment run; run records link the two
flows/monitor.py    progress of a running campaign read from its folder (terminal + progress artifacts)
flows/artifacts.py  evaluation tables, the learning-curve PNG, the audit summary
flows/resources.py  resources_for(stage, config): pool, CPU, memory, accelerators (pure)
```
"""
