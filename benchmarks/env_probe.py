"""What the environment check costs a submission (docs/environment.md), on the dev cluster over SSH.

Measured in the same run, on one reused SSH connection:

* baseline: ``true`` run over the connection (one exec round trip, nothing else);
* the submit check's probe (``envparity.probe_cluster`` with no modules, cache off): one exec
  of ``<python> -I -c <probe>`` reading the hyperpod-lab and torch metadata;
* the ``env diff`` probe of ``examples/train_lm.py`` (its imported packages looked up too);
* ``Client.submit`` with the check off (``env_check=False``), with the probe cached (what a
  submit within 60 s of an earlier probe finds) and with the cache dropped before each
  submit (the worst case: probe + submit). Each job is cancelled at once.

Prints medians and the ratios to the baseline exec and to the unchecked submit; writes
``benchmarks/results/env_probe.json``.

Usage: .venv/bin/python benchmarks/env_probe.py [--reps 7] [--out PATH]   (root; runs ``dev-cluster up``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks._common import write_results  # noqa: E402


def _median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "env_probe.json"))
    a = ap.parse_args()

    from hyperpod_lab import devcluster
    from hyperpod_lab.spec import JobSpec
    from hyperpod_lab.submit import envparity
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    profile = devcluster.up(quiet=True)
    tmp = tempfile.mkdtemp(prefix="hp-bench-env-")
    script = os.path.join(tmp, "sleep.py")
    with open(script, "w") as f:
        f.write("import time\ntime.sleep(600)\n")
    client = Client(JobStore(os.path.join(tmp, "jobs")))
    remote = client.scheduler(profile.name).remote
    example = os.path.join(REPO, "examples", "train_lm.py")
    modules = envparity.script_modules(example)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    res: dict[str, list[float]] = {k: [] for k in ("exec_true", "probe_submit_check", "probe_env_diff",
                                                    "submit_unchecked", "submit_cached", "submit_cache_dropped")}
    ops: dict[str, list[dict]] = {k: [] for k in ("submit_unchecked", "submit_cached", "submit_cache_dropped")}
    for i in range(a.reps + 1):  # the first round warms up and is not counted
        keep = i > 0
        samples = {
            "exec_true": timed(lambda: remote.run(["true"])),
            "probe_submit_check": timed(lambda: envparity.probe_cluster(profile, [], remote=remote, use_cache=False)),
            "probe_env_diff": timed(lambda: envparity.probe_cluster(profile, modules, remote=remote, use_cache=False)),
        }
        for kind, check, drop in (("submit_unchecked", False, False), ("submit_cached", None, False),
                                  ("submit_cache_dropped", None, True)):
            if drop:
                envparity.forget()
            elif check is None:
                envparity.probe_cluster(profile, [], remote=remote)  # as an earlier submit's check did
            remote.ops.clear()
            t0 = time.perf_counter()
            rec = client.submit(JobSpec(script=script, name=f"envbench{i}", cluster=profile.name, nodes=1),
                                env_check=check)
            samples[kind] = time.perf_counter() - t0
            if keep:
                ops[kind].append(dict(remote.ops))
            client.cancel(rec.job_id)
        if keep:
            for k, v in samples.items():
                res[k].append(v)

    med = {k: _median_ms(v) for k, v in res.items()}
    out = {
        "reps": a.reps, "cluster": profile.name, "python": profile.python, "example_modules": modules,
        "median_ms": med, "samples_ms": {k: [round(x * 1000, 1) for x in v] for k, v in res.items()},
        "ops": ops,
        "ratios": {
            "probe_submit_check_over_exec_true": round(med["probe_submit_check"] / med["exec_true"], 2),
            "probe_env_diff_over_exec_true": round(med["probe_env_diff"] / med["exec_true"], 2),
            "submit_cached_over_unchecked": round(med["submit_cached"] / med["submit_unchecked"], 2),
            "submit_cache_dropped_over_unchecked": round(med["submit_cache_dropped"] / med["submit_unchecked"], 2),
        },
    }
    for k, v in med.items():
        print(f"{k:>22}: {v:7.1f} ms (median of {a.reps})")
    for k, v in out["ratios"].items():
        print(f"{k}: {v}x")
    print("execs per submit:", {k: sorted({o.get('exec', 0) for o in v}) for k, v in ops.items()})
    return write_results(a.out, out)


if __name__ == "__main__":
    sys.exit(main())
