"""Reliability drills: prove the pipeline survives hostile input, hostile code, faulty storage and killed processes.

- ``fuzz``: property-based hostile inputs for parsers, calculator, configs, shards and dataset files.
- ``sandbox_escapes``: a catalogue of escape attempts against the sandboxed Python tool.
- ``secrets``: planted fake credentials must not reach any output of the stages.
- ``faultproxy`` + ``storage_faults``: a fault-injecting HTTP proxy before a GCS-API server, and a store workload.
- ``blackhole`` + ``bounds``: a storage endpoint that never answers, parser floods and hostile configs, each case a
  process under a deadline (``hangs``, ``cli_tracebacks``).
- ``supervisor``: ``KillDrill``, start / SIGKILL / restart one stage subprocess; ``partial_visible``.
- ``kills``: SIGKILL the trainer (also mid-publish), a rollout worker or the evaluator at random moments and
  account for every group, weights version and eval file.
- ``runner``: ``rollstream drills`` (``cli``) runs them all, merges ``reliability.*`` figures into
  ``bench/results.json`` and regenerates ``RELIABILITY.md``.

Nothing here is imported by the pipeline itself; hypothesis (a test dependency) is imported only by ``fuzz``'s
strategies, at run time.
"""
