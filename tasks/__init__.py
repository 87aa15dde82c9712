"""One thin Prefect task per stage (docs/STAGES.md): parameters in, ONE ``pipelines_lib.stages`` call, manifest out.

```
tasks/common.py          open_campaign(url, storage_options) -> (Store, CampaignConfig); stage_run(...) links
                         the Prefect run to its outputs (records.RunRecord); retry policy
tasks/init.py            init_campaign      campaign.json (config snapshot)
tasks/prep.py            prep_dataset       dataset/ + dataset/_SUCCESS
tasks/warm_start.py      warm_start         weights/v00000000 + LATEST
tasks/collect_rollouts.py collect_rollouts  trajectories/v*/<worker>.<nonce>-<seq>-<groups>.arrow until train/DONE.json
tasks/train.py           train              train/checkpoints, train/consumed, weights/v*, train/DONE.json
tasks/evaluate.py        evaluate_version   eval/v<N>.json
tasks/audit.py           audit              audit/<timestamp>.json + .txt
tasks/colocated.py       colocated_campaign prep .. evaluate in one process (placement: colocated)
```

Every library function is idempotent through the campaign's markers, so a task rerun after success returns
the same manifest without writing anything; a rerun after a crash resumes. Tasks retry only failures that
may pass (storage outages, connection errors); a bug or a bad config fails at once.
"""
