"""One ``checkpoint.saved`` a node for the memory and peer tiers (issue 27, Deliver 2).

With 8 ranks a node every memory snapshot was 8 events and every replication round 8 more, one
a rank: at 2,048 ranks and a memory save every step, 4,096 events a step, most of what a watcher
reads. A per-rank line adds nothing there: the ranks of a node save the same step together. So
where a node holds more than one rank of a checkpointer's world, the node's reporter (its lowest
rank, :attr:`TieredCheckpointer._reporter`) writes one event for the node once the node's shared
memory holds every local rank's snapshot of the step (and every replica the node receives), read
from the slot records there (:class:`~hyperpod_lab.runtime.checkpoint.slots.SlotRing`); the
per-rank detail stays derivable from the event (``ranks`` and ``rank_bytes``, ``of_ranks``) and
from the slots themselves (``<node_dir>/rank-R``, ``<node_dir>/replica-of-rank-R``). A node with
one rank keeps the per-rank events.
"""

from __future__ import annotations

import os
import time

from hyperpod_lab.runtime.checkpoint.slots import SlotRing

#: how often the reporter looks at the node's slots while a local rank's save is still running, s
POLL_S = 0.01


def wait_for_slots(node_dir: str, dirs: dict[int, str], step: int, keep_last: int, key: bytes | None,
                   timeout_s: float) -> tuple[dict[int, int], list[int]]:
    """Wait until each directory of ``dirs`` (rank -> slot directory name under ``node_dir``) has
    a complete slot of ``step`` or a later one, at most ``timeout_s`` seconds.

    Returns:
        ``({rank: bytes of its slot}, [ranks still missing at the deadline])``.
    """
    deadline = time.monotonic() + timeout_s
    found: dict[int, int] = {}
    while True:
        for r, name in dirs.items():
            if r in found:
                continue
            d = os.path.join(node_dir, name)
            if not os.path.isdir(d):
                continue
            for _slot, rec, _meta in SlotRing(d, keep_last, create=False, key=key).complete():
                if int(rec.get("step", -1)) >= step:
                    found[r] = int(rec["nbytes"])
                    break
        if len(found) == len(dirs) or time.monotonic() >= deadline:
            return found, sorted(set(dirs) - set(found))
        time.sleep(POLL_S)


def held_bytes(node_dir: str, names: list[str]) -> int:
    """Bytes of the slot data files (``slot-*.bin``) in the directories ``names`` of
    ``node_dir``: the shared memory the node holds for those ranks and replicas."""
    total = 0
    for name in names:
        d = os.path.join(node_dir, name)
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for f in entries:
            if f.startswith("slot-") and f.endswith(".bin"):
                try:
                    total += os.path.getsize(os.path.join(d, f))
                except OSError:
                    pass
    return total
