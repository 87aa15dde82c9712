"""Read back the groups a logged step trained on, and refuse any that are not what it trained on.

A restarted trainer re-trains the steps logged after its checkpoint (``StreamingTrainer.restore``), and
``rollstream replay`` recomputes a step, from the rows their consumption logs name, read again through the channel
(``GroupSource.reread``: on the folder backend, the shard read with the trainer's limits). Shards are create-only,
but a file can still be rewritten under its name; so every group read back is checked before it reaches a step:

```
 shard reads and validates within the trainer's limits     (the folder's reread: ShardError otherwise)
 rows [row_start, row_end) exist and are all of group_id    (a row range past the end would silently shrink)
 group_digest(rows) == the digest the log recorded          (None in older logs: unknown, so not compared)
 group_problem / infra_problem: none                        (what the tailer checked before the step)
```

Anything else is a ``ReplayError`` naming the step, the shard and what differs: the step is not re-trained
(no publication, no checkpoint), and the trainer stops rather than train on whatever the shard now holds.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines_lib.records import ConsumedGroup, ConsumptionLog
from pipelines_lib.storage.errors import StorageError
from pipelines_lib.trajectory.channel import GroupSlice, GroupSource
from pipelines_lib.trajectory.codec import ShardError
from pipelines_lib.trajectory.needs import TrainerNeeds
from pipelines_lib.trajectory.trainable import group_digest, group_problem, infra_problem


class ReplayError(RuntimeError):
    """A logged step's groups cannot be read back as they were trained on; the message names the step and shard."""


def reload_group(source: GroupSource, g: ConsumedGroup, entry: ConsumptionLog, needs: TrainerNeeds, *,
                 uri: Callable[[str], str] = str) -> GroupSlice:
    """Group ``g`` of logged step ``entry``, read again from ``source`` (the trainer's channel) and checked (module
    docstring); ``uri`` names a shard in the messages."""
    where = f"step {entry.step}: {uri(g.shard)} rows [{g.row_start}, {g.row_end}) (group {g.group_id})"
    if not 0 <= g.row_start < g.row_end:
        raise ReplayError(f"cannot replay {where}: not a row range")
    try:
        rows = source.reread(g.shard, g.row_start, g.row_end)
    except (ShardError, StorageError, KeyError) as e:  # KeyError: the memory channel holds no such shard
        raise ReplayError(f"cannot replay {where}: {e}") from e
    if rows.num_rows != g.row_end - g.row_start:
        raise ReplayError(f"cannot replay {where}: the shard holds {rows.num_rows} of those rows")
    if set(rows.column("group_id").to_pylist()) != {g.group_id}:
        raise ReplayError(f"cannot replay {where}: those rows are not all of group {g.group_id}")
    if g.digest is not None and (now := group_digest(rows)) != g.digest:
        raise ReplayError(f"cannot replay {where}: its content differs from what the step trained on (digest "
                          f"{now}, logged {g.digest}): the shard was rewritten after it was consumed")
    problem = (group_problem(rows, needs, folder_version=g.version, newest_version=entry.trainer_version)
               or infra_problem(rows))
    if problem is not None:
        raise ReplayError(f"cannot replay {where}: {problem}")
    return GroupSlice(shard=g.shard, version=g.version, row_start=g.row_start, row_end=g.row_end,
                      group_id=g.group_id, table=rows)


def reload_step(source: GroupSource, entry: ConsumptionLog, needs: TrainerNeeds, *,
                uri: Callable[[str], str] = str) -> list[GroupSlice]:
    """Every group of logged step ``entry``, in log order (``reload_group``)."""
    return [reload_group(source, g, entry, needs, uri=uri) for g in entry.groups]


def undigested(entry: ConsumptionLog) -> int:
    """Groups of ``entry`` logged without a digest (older logs): replayed with the trainable checks only."""
    return sum(g.digest is None for g in entry.groups)


__all__ = ["ReplayError", "reload_group", "reload_step", "undigested"]
