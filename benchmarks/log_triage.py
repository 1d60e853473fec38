"""Log triage by byte range against reading whole logs (issue 18, item 3).

A job directory in torchrun's layout (``logs/torchrun/<run>/attempt_<k>/<local_rank>/
{stdout,stderr}.log``, ``ranks/rank-R.json``) with ``--ranks`` ranks whose ``stdout.log`` holds
``--mb`` MB each (the lines every rank prints, a few of its own) and one rank's ``stderr.log``
a Python traceback, tracked as a local job. Measured in the same run, each ``--repeat`` times
(median):

* baseline: what a triage without byte ranges does: every rank's files read whole (the
  scheduler's ``logs()``, in 1 MiB pages), then the traceback finder over all of it;
* ``triage``: ``hyperpod_lab.submit.logtriage.triage`` as the Lab's first request makes it (the tail
  of each file collapsed across ranks, and the first failure);
* ``follow``: a follow poll with that reply's cursor (nothing new: nothing read);
* ``search``: one search request (8 MiB scan bound) for a string that is not there.

Printed: seconds and bytes read of each, ratios against the baseline; written as JSON.

Usage: .venv/bin/python benchmarks/log_triage.py [--ranks 4] [--mb 50] [--repeat 3]
       [--out benchmarks/results/log_triage.json]

``--scale 2,64,512,2048`` (issue 27, item 4): the triage *first view* of synthetic jobs of that
many ranks, each with rank 1,337 (modulo the size) failing: events by the project's EventWriter
(:func:`benchmarks.scale.write_job`), per-rank logs of ``--kb`` KB in torchrun's layout
(:func:`write_rank_logs`). Per job and path (``local`` files; with ``--ssh`` also the dev
cluster's sshd on loopback, read-only: nothing is submitted to Slurm): the first view as the
Lab's first request makes it (``triage(tail=True)``: the failing ranks, 4 healthy ones, the
first failure; the first call and the median of ``--repeat``), the CLI's ``logs --triage``,
one search request (``--baseline``: also a view of every rank's files, at most 512, as the
code before made the first view), the files opened and the round trips (counted in the file-access layer,
:class:`CountingFiles`), bytes read and the reply's size; ratios against the first (smallest)
job of the same run. JSON to ``benchmarks/results/log_triage_scale.json``.

Usage: .venv/bin/python benchmarks/log_triage.py --scale 2,64,512,2048 [--kb 190] [--steps 20] [--ssh]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks._common import write_results  # noqa: E402

TRACEBACK = """[rank{r}]: Traceback (most recent call last):
[rank{r}]:   File "/shared/train.py", line 31, in <module>
[rank{r}]:     loss = model(batch)
[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered
"""


def build(job_dir: str, ranks: int, mb: int, failing: int) -> None:
    run = os.path.join(job_dir, "logs", "torchrun", "bench_run", "attempt_0")
    os.makedirs(os.path.join(job_dir, "ranks"), exist_ok=True)
    block = "".join(f"step {i} loss {1.0 / (i + 1):.6f} tokens/s 123456\n" for i in range(1000)).encode()
    for r in range(ranks):
        slot = os.path.join(run, str(r))
        os.makedirs(slot, exist_ok=True)
        with open(os.path.join(slot, "stdout.log"), "wb") as f:
            f.write(f"loading data...\nrank {r} says hello\n".encode())
            for _ in range(mb * 10 ** 6 // len(block)):
                f.write(block)
        with open(os.path.join(slot, "stderr.log"), "w") as f:
            f.write(TRACEBACK.format(r=r) if r == failing else "")
        with open(os.path.join(job_dir, "ranks", f"rank-{r}.json"), "w") as f:
            json.dump({"rank": r, "local_rank": r, "node": "bench", "host": "bench",
                       "log_file": os.path.join(slot, "stdout.log"), "world_size": ranks}, f)


WARNING = "/shared/train.py:12: UserWarning: TypedStorage is deprecated. It will be removed in the future."
RANKS_PER_NODE = 8


def write_rank_logs(job_dir: str, ranks: int, failing: int, kb: int = 64, ranks_per_node: int = RANKS_PER_NODE) -> int:
    """Per-rank logs of a synthetic job of ``ranks`` ranks in torchrun's layout, one run folder
    per node (``logs/torchrun/n<node>/attempt_0/<local rank>/{stdout,stderr}.log``) and each
    rank's ``ranks/rank-R.json`` (``log_file``, ``node``): every rank's ``stdout.log`` holds
    ~``kb`` KB (the lines every rank prints, one of its own, step lines), its ``stderr.log``
    the same :data:`WARNING` (every rank), and rank ``failing``'s a Python traceback after it.
    The events beside them: :func:`benchmarks.scale.write_job`. Returns the bytes written."""
    os.makedirs(os.path.join(job_dir, "ranks"), exist_ok=True)
    steps = "".join(f"step {i} loss {1.0 / (i + 1):.6f} tokens/s 123456\n" for i in range(100)).encode()
    reps = max(1, kb * 1000 // len(steps))
    total = 0
    for r in range(ranks):
        node, local = r // ranks_per_node, r % ranks_per_node
        slot = os.path.join(job_dir, "logs", "torchrun", f"n{node}", "attempt_0", str(local))
        os.makedirs(slot, exist_ok=True)
        out = b"loading data...\n" + f"rank {r} says hello\n".encode() + steps * reps
        err = (WARNING + "\n" + (TRACEBACK.format(r=r) if r == failing else "")).encode()
        with open(os.path.join(slot, "stdout.log"), "wb") as f:
            f.write(out)
        with open(os.path.join(slot, "stderr.log"), "wb") as f:
            f.write(err)
        with open(os.path.join(job_dir, "ranks", f"rank-{r}.json"), "w") as f:
            json.dump({"rank": r, "local_rank": local, "node": f"n{node}", "host": f"n{node}",
                       "log_file": os.path.join(slot, "stdout.log"), "world_size": ranks}, f)
        total += len(out) + len(err)
    return total


class CountingFiles:
    """A file-access layer (a scheduler's ``remote``: local, mounted or SSH) that counts what goes
    through it: ``opened`` (paths read: every ``read_from`` and each file ``read_tails`` returned
    bytes of), ``listings`` (``list_files``/``listdir`` calls), ``calls`` (all of them: round
    trips over SSH, a ``read_tails`` being one). Everything else is the wrapped object's."""

    def __init__(self, inner):
        self._inner = inner
        self.reset()

    def reset(self) -> None:
        self.opened: list[str] = []
        self.listings = 0
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def read_from(self, path, offset=0, length=None):
        self.calls += 1
        self.opened.append(path)
        return self._inner.read_from(path, offset, length)

    def list_files(self, path):
        self.calls += 1
        self.listings += 1
        return self._inner.list_files(path)

    def listdir(self, path):
        self.calls += 1
        self.listings += 1
        return self._inner.listdir(path)

    def read_tails(self, directory, starts, wants=None, max_bytes=None):
        self.calls += 1
        self.listings += 1
        sizes, data, errors = self._inner.read_tails(directory, starts, wants, max_bytes)
        self.opened.extend(f"{directory}/{n}" for n in data)
        return sizes, data, errors


class FixedClient:
    """What :func:`hyperpod_lab.submit.logtriage.triage` needs of a Client for one job record and
    one scheduler (a job read over the dev cluster's sshd without submitting it to Slurm)."""

    def __init__(self, rec, sched):
        self.rec, self.sched = rec, sched

    def get(self, job_id):
        return self.rec

    def scheduler(self, cluster):
        return self.sched


def timed(fn, repeat: int):
    runs, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs), out


FAILING = 1337


def measure_scale(client, job_id: str, files: CountingFiles, repeat: int, every: bool = False) -> dict:
    """The first view, the CLI's view and one search of job ``job_id`` (see the module docstring);
    ``every``: also the baseline, a view of every rank's files (at most 512) as the code before
    this change made its first view."""
    import io

    from hyperpod_lab import cli
    from hyperpod_lab.submit import logtriage as lt

    def view():
        files.reset()
        t = time.perf_counter()
        reply = lt.triage(client, job_id, tail=True)
        return time.perf_counter() - t, reply, len(files.opened), files.calls

    first_s, reply, opened, calls = view()
    runs = [view() for _ in range(repeat)]
    out = io.StringIO()
    t = time.perf_counter()
    cli.run(["logs", job_id, "--triage"], client=client, out=out)
    cli_s = time.perf_counter() - t
    files.reset()
    t = time.perf_counter()
    sea = lt.triage(client, job_id, q="no such text", failure=False)
    search_s = time.perf_counter() - t
    search_opened, search_calls = len(files.opened), files.calls
    warn = [ln for ln in reply["lines"] if ln["text"] == WARNING]
    base = {}
    if every:  # the first view as the code before made it: every rank's files (at most 512)
        files.reset()
        t = time.perf_counter()
        rec = client.get(job_id)
        logs = lt.RankLogs(client.scheduler(rec.cluster), rec)
        known = logs.ranks()
        fail = lt.first_failure(logs, known, lt.read_fault_events(files, logs.rec.job_dir))
        v = lt.read_view(logs, known, {}, lt.DEFAULT_LENGTH, True, True)
        v["nodes"] = {r: logs.node(r) for r in known}
        base = {"every_rank_view_s": round(time.perf_counter() - t, 4), "every_rank_files_opened": len(files.opened),
                "every_rank_round_trips": files.calls, "every_rank_reply_bytes": len(json.dumps(v)),
                "every_rank_first_failure_rank": (fail or {}).get("rank")}
    return {**base, "first_view_first_call_s": round(first_s, 4), "first_view_s": round(statistics.median(r[0] for r in runs), 4),
            "files_opened": opened, "round_trips": calls, "bytes_read": reply["bytes_read"],
            "reply_bytes": len(json.dumps(reply)), "ranks_read": reply["ranks"], "first_failure_rank":
            (reply["first_failure"] or {}).get("rank"), "warning_entries": len(warn),
            "warning_count": warn[0]["count"] if warn else 0, "cli_s": round(cli_s, 4), "cli_chars": len(out.getvalue()),
            "search_s": round(search_s, 4), "search_files_opened": search_opened, "search_round_trips": search_calls,
            "search_scanned": sea["scanned"], "search_note": sea.get("note")}


def main_scale(a) -> int:
    from benchmarks.scale import write_job
    from hyperpod_lab.schedulers import for_profile
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobRecord, JobStore

    sizes = [int(x) for x in a.scale.split(",")]
    base = profile = None
    if a.ssh:
        from hyperpod_lab import devcluster

        profile = devcluster.profile_for()
        base = os.path.join(profile.shared_root, "hyperpod-lab-bench")
        os.makedirs(base, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix="triage-scale-", dir=base)
    os.environ.setdefault("HYPERPOD_LAB_CONFIG", os.path.join(work, "clusters.toml"))
    os.environ.setdefault("HYPERPOD_LAB_DATA_DIR", os.path.join(work, "data"))
    rows = []
    ssh_sched = for_profile(profile) if profile is not None else None
    try:
        for n in sizes:
            job_dir, job_id = os.path.join(work, f"job-{n}"), f"triage-{n}"
            t = time.perf_counter()
            events = write_job(job_dir, job_id, n, steps=a.steps, fault_rank=FAILING)
            log_bytes = write_rank_logs(job_dir, n, FAILING % n, kb=a.kb)
            print(f"{n} ranks: {events} events, {log_bytes / 1e6:.1f} MB of logs written in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
            store = JobStore(os.path.join(work, "jobs"))
            rec = JobRecord(job_id, job_id, "local", "local", "0", job_dir, {}, status="failed")
            store.put(rec)
            local = Client(store)
            sched = local.scheduler("local")
            if not isinstance(sched.remote, CountingFiles):
                sched.remote = CountingFiles(sched.remote)
            paths = [("local", local, sched.remote)]
            if ssh_sched is not None:
                if not isinstance(ssh_sched.remote, CountingFiles):
                    ssh_sched.remote = CountingFiles(ssh_sched.remote)
                srec = JobRecord(job_id, job_id, profile.name, "slurm", "0", job_dir, {}, status="failed")
                paths.append(("ssh", FixedClient(srec, ssh_sched), ssh_sched.remote))
            for label, client, files in paths:
                row = {"path": label, "ranks": n, "events": events, "log_bytes": log_bytes,
                       **measure_scale(client, job_id, files, a.repeat, every=a.baseline)}
                rows.append(row)
                if "every_rank_view_s" in row:
                    print(f"  {label:5s} baseline, every rank's files: {row['every_rank_view_s'] * 1e3:.1f} ms, "
                          f"{row['every_rank_files_opened']} files opened, reply "
                          f"{row['every_rank_reply_bytes'] / 1e3:.0f} kB", flush=True)
                print(f"  {label:5s} first view {row['first_view_s'] * 1e3:.1f} ms (first call "
                      f"{row['first_view_first_call_s'] * 1e3:.1f} ms), {row['files_opened']} files opened, "
                      f"{row['round_trips']} round trips, {row['bytes_read'] / 1e3:.0f} kB read, reply "
                      f"{row['reply_bytes'] / 1e3:.0f} kB; rank {row['first_failure_rank']} first, ranks read "
                      f"{row['ranks_read']}, warning: {row['warning_entries']} entry x{row['warning_count']}; CLI "
                      f"{row['cli_s'] * 1e3:.1f} ms; search {row['search_s'] * 1e3:.1f} ms "
                      f"({row['search_files_opened']} files)", flush=True)
            shutil.rmtree(job_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if ssh_sched is not None:
            ssh_sched.remote.close()
    first = {r["path"]: r for r in rows if r["ranks"] == sizes[0]}
    for r in rows:
        b = first.get(r["path"])
        for k in ("first_view_s", "files_opened", "round_trips", "reply_bytes", "cli_s"):
            r[f"{k}_ratio"] = round(r[k] / b[k], 3) if b and b[k] else None
        if "every_rank_view_s" in r:
            r["every_rank_over_first_view"] = round(r["every_rank_view_s"] / r["first_view_s"], 1)
    return write_results(a.out, {"benchmark": "log_triage_scale", "sizes": sizes, "kb_per_rank": a.kb,
                                 "steps": a.steps, "repeat": a.repeat, "failing_rank": FAILING,
                                 "machine": platform.node(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                                 "rows": rows}, said="wrote")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mb", type=int, default=50, help="MB of each rank's stdout.log")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--scale", help="comma-separated rank counts: the first-view measurement of issue 27 item 4")
    p.add_argument("--kb", type=int, default=190, help="--scale: KB of each rank's stdout.log")
    p.add_argument("--steps", type=int, default=20, help="--scale: steps of each synthetic job's events")
    p.add_argument("--ssh", action="store_true", help="--scale: also over the dev cluster's sshd (read-only)")
    p.add_argument("--baseline", action="store_true", help="--scale: also the view of every rank's files, as "
                                                             "the code before made the first view")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.scale:
        a.out = a.out or os.path.join(ROOT, "benchmarks", "results", "log_triage_scale.json")
        main_scale(a)
        return
    a.out = a.out or os.path.join(ROOT, "benchmarks", "results", "log_triage.json")

    tmp = tempfile.mkdtemp(prefix="hyperpod-lab-bench-triage-")
    os.environ.setdefault("HYPERPOD_LAB_CONFIG", os.path.join(tmp, "clusters.toml"))
    os.environ.setdefault("HYPERPOD_LAB_DATA_DIR", os.path.join(tmp, "data"))
    from benchmarks._common import track_local_job
    from hyperpod_lab.submit import logtriage as lt
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    try:
        job_dir = os.path.join(tmp, "job")
        failing = a.ranks - 1
        build(job_dir, a.ranks, a.mb, failing)
        store = JobStore(os.path.join(tmp, "jobs"))
        rec = track_local_job(job_dir, "bench-triage", store)
        client = Client(store)
        sched = client.scheduler(rec.cluster)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(job_dir, "logs"))
                    for f in fs)

        def baseline():
            n, found = 0, []
            logs = lt.RankLogs(sched, rec)
            for r in range(a.ranks):
                for src in logs.sources(r):
                    pos = 0
                    while True:  # the whole file, in 1 MiB pages (as Scheduler.logs reads)
                        chunk = logs.read(src, pos, 1 << 20)
                        data = chunk.raw or b""
                        n += len(data)
                        found.extend(lt.find_tracebacks(lt.split_lines(data, pos, True, True)[0]))
                        if not data or chunk.end >= (chunk.size or 0):
                            break
                        pos = chunk.end
            return n, found

        t_base, (base_bytes, found) = timed(baseline, a.repeat)
        assert found and "illegal memory access" in found[0].exception
        t_tri, reply = timed(lambda: lt.triage(client, rec.job_id, tail=True), a.repeat)
        assert reply["first_failure"]["rank"] == failing, reply["first_failure"]
        cursor = lt.decode_log_cursor(reply["cursor"])
        t_fol, fol = timed(lambda: lt.triage(client, rec.job_id, cursor=cursor, failure=False), a.repeat)
        t_sea, sea = timed(lambda: lt.triage(client, rec.job_id, q="no such text", failure=False), a.repeat)
        result = {
            "benchmark": "log_triage", "ranks": a.ranks, "mb_per_rank": a.mb, "log_bytes": total,
            "repeat": a.repeat, "machine": platform.node(), "cpus": os.cpu_count(),
            "baseline_whole_read": {"s": t_base, "bytes_read": base_bytes},
            "triage_view_and_failure": {"s": t_tri, "bytes_read": reply["bytes_read"], "lines": len(reply["lines"])},
            "follow_poll": {"s": t_fol, "bytes_read": fol["bytes_read"]},
            "search_8mib": {"s": t_sea, "bytes_read": sea["bytes_read"], "scanned": sea["scanned"]},
        }
        result["ratio_time_baseline_over_triage"] = t_base / t_tri
        result["ratio_bytes_baseline_over_triage"] = base_bytes / max(1, reply["bytes_read"])
        print(f"logs: {a.ranks} ranks x {a.mb} MB ({total / 1e6:.0f} MB)")
        print(f"baseline (whole files + traceback scan): {t_base:.3f} s, {base_bytes / 1e6:.1f} MB read")
        print(f"triage (tail view + first failure):      {t_tri:.3f} s, {reply['bytes_read'] / 1e3:.1f} kB read "
              f"-> {result['ratio_time_baseline_over_triage']:.0f}x faster, "
              f"{result['ratio_bytes_baseline_over_triage']:.0f}x fewer bytes")
        print(f"follow poll (nothing new):               {t_fol:.4f} s, {fol['bytes_read']} bytes read")
        print(f"search (8 MiB scan bound):               {t_sea:.3f} s, {sea['scanned'] / 1e6:.1f} MB scanned")
        write_results(a.out, result, said="wrote")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
