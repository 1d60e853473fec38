"""Replica group numbers of a checkpointless job are never given twice (issue 27).

Two parties number new groups beyond the job's first ``nodes``: the supervisor, when a spare
replaces a lost group (``Supervisor.replace_group``), and ``hyperpod-lab scale``
(``Scheduler.scale``), for a joining allocation. Before ``jobdir.claim_groups`` each counted on
its own from ``nodes``; the 16-node dev-cluster test (tests/runtime/test_scale16_slurm.py) then
ran the spare on n17 and the joining node n5 both as group 16: both wrote rank-32/33's rank and
event files, torchft dropped one of them from the quorum ("replica group 16 left the quorum"),
and 15 final parameter files came out of 16 groups. Here: the real supervisor's numbering and
``scale``'s (``claim_groups`` on the scheduler's ``remote.create_new``, as ``Scheduler.scale``
calls it; end to end: tests/contract/test_contract.py's local scale, the 16-node test) on one
job directory, and many threads claiming at once.
"""

from __future__ import annotations

import sys
import threading

from hyperpod_lab.events import LocalFiles
from hyperpod_lab.jobdir import JobPaths, claim_groups
from hyperpod_lab.node import supervisor as sup_mod


def _supervisor(job_dir: str, nodes: int) -> sup_mod.Supervisor:
    return sup_mod.Supervisor(job_dir, "j", nodes=nodes, spares=1, mode="checkpointless", launch=["true"],
                              srun_opts=[], procs_per_node=2, health=False, health_args=[], requeue=False,
                              python=sys.executable, slurm_job_id="1", restart=0)


def test_a_spare_and_a_join_never_get_the_same_group_number(tmp_path):
    job_dir = str(tmp_path / "job")
    paths, files = JobPaths(job_dir), LocalFiles()
    files.makedirs(paths.replicas)
    sup = _supervisor(job_dir, nodes=16)
    # the order of the 16-node test: a spare replaces a lost group, then `scale --add-nodes 1`
    # starts its count at nodes + the joins so far (16), as it did before the fix
    spare = sup._new_group()
    join = claim_groups(files.create_new, paths, 16 + 0, 1)
    assert spare == 16 and join == 17, (spare, join)
    # and the other way round: a join of 2 took 18, 19; the next spare gets 20
    assert claim_groups(files.create_new, paths, 16 + 1, 2) == 18
    assert sup._new_group() == 20
    # a join whose block is cut by a spare's number starts after it (gaps are fine, no sharing)
    files.create_new(paths.replica_claim(22))
    assert claim_groups(files.create_new, paths, 21, 2) == 23


def test_parties_claiming_at_once_get_distinct_numbers(tmp_path):
    paths, files = JobPaths(str(tmp_path)), LocalFiles()
    files.makedirs(paths.replicas)
    got: list[list[int]] = []
    lock = threading.Lock()

    def party(count: int):
        mine = []
        for _ in range(20):
            first = claim_groups(files.create_new, paths, 8, count)
            mine.extend(range(first, first + count))
        with lock:
            got.append(mine)

    threads = [threading.Thread(target=party, args=(c,)) for c in (1, 1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numbers = [n for mine in got for n in mine]
    assert len(numbers) == 20 * (1 + 1 + 2 + 3)
    assert len(set(numbers)) == len(numbers), sorted(numbers)
    assert min(numbers) >= 8
