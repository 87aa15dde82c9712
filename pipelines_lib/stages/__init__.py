"""The stages: the only modules that take a whole ``CampaignConfig``; each hands core code its own sections.

```
campaign     init_campaign (campaign.json), load_campaign_config, campaign_status
prep         dataset/ splits                                   dataset.prep(config.dataset)
warm_start   weights/v00000000                                 train.sft, model.hf_import, publish
collect      trajectories/ of one rollout worker               rollout.orchestrator, rollout.episodes, engine.backends
train        train/, weights/v<N>, train/DONE.json             train.trainer.StreamingTrainer(config.trainer)
evaluate     eval/v<N>.json                                    engine.backends, evaluate.evaluate_model(config.eval, ...)
audit        audit/<utc>.json                                  audit.audit_campaign
replay       nothing (reads only; an optional Parquet dump)    train.replay.replay_step(trainer, step)
colocated    all of the above up to the audit, in one process  the stages above; trainer -> engine weights in
             holding the device (placement: colocated)          device memory (DeviceWeights)
```
Prefect tasks (``tasks/``) call these; these call core code; core code never imports them.
"""
