"""The training runtime every trainer shares.

- :mod:`cascade.training.launch`: starting workers under ``torch.distributed.run``, joining the
  process group, reading back a launch's ``result.json``;
- :mod:`cascade.training.deepspeed_config`: the one DeepSpeed config builder;
- :mod:`cascade.training.resumable_run`: the MLflow run a retry continues;
- :mod:`cascade.training.checkpoints`: DeepSpeed checkpoints, resume, finished phases, run
  fingerprints;
- :mod:`cascade.training.crash_points`: ``CASCADE_CRASH_AT`` fault injection.

Result files go through :func:`cascade.results.write_result` (atomic).
"""
