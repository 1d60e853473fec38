"""Time to detect and recover a hung rank: the launch agent's hang watchdog versus a collective timeout.

A 2-rank DDP job on the local backend (``tests/scripts/hang_train.py``: gloo on CPU, a gradient
all-reduce every step, ``--sleep`` seconds of compute per step, a persistent checkpoint every 10
steps) runs until step ``--hang-at``; then rank 1 is stopped with ``inject-fault --kind hang``
(SIGSTOP: the process is alive, holds its sockets and answers nothing, as a rank stuck in a
driver or a deadlock is). Rank 0 then waits in its all-reduce. Measured from the SIGSTOP:

* ``detect_s``: to the first ``fault.detected`` after it (the watchdog's ``reason: "hang"``, or,
  in the baseline, the launch agent's report of the failure, which torchrun gives only after it
  has stopped every worker: the stopped rank 1 ignores SIGTERM, so that is 30 s (torchrun's grace)
  after rank 0's collective timed out); ``collective_error_s``: to the moment torchrun saw rank 0
  fail (its ``closing signal SIGTERM`` log line: the collective timeout);
* ``first_step_s``: to the first completed ``step`` event after the recovery (the workers
  restarted by torchrun, restored from the checkpoint).

Runs:

* ``watchdog_derived``: the default, T derived from the job's step times (``max(30 s, 10 x p99)``
  after warm-up: the 30 s floor for these ~0.06 s steps);
* ``watchdog_5s``: ``--hang-timeout 5``;
* ``collective_timeout``: the baseline, with no watchdog (``--hang-timeout`` of a week) and the
  default process group's collective timeout set short and explicit
  (``HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S``, default ``--baseline-timeout 60``): rank 0's all-reduce
  times out, it fails, torchrun stops the (stopped) rank 1 and restarts both.

Early hangs (issue 26 item 4; ``--early``, or ``--only-early`` to run just these two): rank 1
stopped at step ``--early-hang-at`` (3), long before the derived T exists (about 25 steps):

* ``early_watchdog``: ``--startup-timeout 10``: caught by the early budget
  ``max(min(30 s, 10 s), 10 x the slowest step so far)``;
* ``early_collective_timeout``: the baseline, no budget (``--startup-timeout`` and
  ``--hang-timeout`` of a week; what every early hang got before issue 26): rank 0's collective
  times out, and the agent then reports the stopped rank 1 (``timeout_source: "group-stop"``) and
  SIGKILLs it at once; before issue 26 torchrun's 30 s SIGTERM grace for the stopped rank came on
  top of this baseline.

    .venv/bin/python benchmarks/hang_detection.py --only-early --steps 150   # ~3 min

torch's own default collective timeout (``torch.distributed.constants``: 30 min for gloo; 10 min
for NCCL, the documented default of ``init_process_group``) is too long to wait for: it is
projected as the baseline run with its timeout replaced by the default (each measured time + the
default - the baseline's timeout). Prints the ratios and writes
``benchmarks/results/hang_detection.json`` (``--recompute``: the projections and ratios again from
that file, running nothing).

    .venv/bin/python benchmarks/hang_detection.py     # ~4 min on a 2-core machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SCRIPT = os.path.join(ROOT, "tests", "scripts", "hang_train.py")
A_WEEK_S = 7 * 24 * 3600
NCCL_DEFAULT_S = 600.0  # torch's documented NCCL default (init_process_group), when this torch has no NCCL

from benchmarks._common import write_results  # noqa: E402


def run_once(client, name: str, hang_timeout: float | None, steps: int, sleep: float, hang_at: int,
             collective_timeout: float, timeout_s: float, startup_timeout: float | None = None) -> dict:
    """Submit, SIGSTOP rank 1 at step ``hang_at``, follow to the end; the measurements (s)."""
    from hyperpod_lab import cli

    opts = ["--hang-timeout", str(hang_timeout)] if hang_timeout is not None else []
    if startup_timeout is not None:
        opts += ["--startup-timeout", str(startup_timeout)]
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--procs-per-node", "2", "--name", f"bench-hang-{name}",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--env", f"HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S={collective_timeout:g}", *opts,
                      "--", "--steps", str(steps), "--sleep", str(sleep), "--every", "10"], client=client)
    reader, events, t_hang, info = client.event_reader(job_id), [], None, None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += reader.poll()
        if t_hang is None and any(e.kind == "step" and e.data["step"] >= hang_at for e in events):
            t_hang = time.time()
            info = client.inject_fault(job_id, 1, kind="hang")
        if any(e.kind == "finished" for e in events):
            break
        time.sleep(0.05)
    else:
        client.cancel(job_id)
        raise SystemExit(f"{job_id}: not finished within {timeout_s} s")
    rec = client.wait(job_id, timeout_s=120)
    after = [e for e in events if e.time > t_hang]
    faults = [e for e in after if e.kind == "fault.detected"]
    detected = min(faults, key=lambda e: e.time)
    recovered = [e for e in after if e.kind == "recovery.completed"]
    first_step = min(e.time for e in after if e.kind == "step" and (not recovered or e.time >= recovered[0].time - 1e-3)
                     and e.time > detected.time)
    steady = [e for e in events if e.kind == "step" and e.time < t_hang]
    step_s = (steady[-1].time - steady[10].time) / (steady[-1].data["step"] - steady[10].data["step"]) \
        if len(steady) > 11 else None
    hang = [e for e in faults if e.data.get("reason") == "hang"]
    return {"collective_error_s": _collective_error_s(client.logs(job_id), t_hang),"job_id": job_id, "status": rec.status, "pid": info.get("pid"), "step_s": step_s,
            "detect_s": round(detected.time - t_hang, 3), "first_step_s": round(first_step - t_hang, 3),
            "detected_by": detected.writer, "detected_reason": detected.data.get("reason"),
            "hang_at_step": hang_at, "stopped_at_step": hang[0].data.get("step") if hang else None,
            "hang_timeout_s": hang[0].data.get("hang_timeout_s") if hang else None,
            "timeout_source": hang[0].data.get("timeout_source") if hang else None,
            "stalled_s": hang[0].data.get("stalled_s") if hang else None,
            "stacks": hang[0].data.get("stacks") if hang else None,
            "runtime_downtime_s": recovered[0].data.get("downtime_s") if recovered else None,
            "restored_step": recovered[0].data.get("restored_step") if recovered else None}


def _collective_error_s(log: str, t_hang: float) -> float | None:
    """Seconds from the hang to the moment torchrun saw a worker fail (its first ``Sending process
    P closing signal SIGTERM`` line, glog time stamp ``W<MMDD> <HH:MM:SS.us>``, local time): in the
    baseline, rank 0's collective timing out. None when the log has no such line."""
    import re
    from datetime import datetime

    m = re.search(r"^[WIE](\d{4}) (\d\d:\d\d:\d\d\.\d+) .*closing signal SIGTERM", log, re.M)
    if not m:
        return None
    year = datetime.fromtimestamp(t_hang).year
    when = datetime.strptime(f"{year}{m.group(1)} {m.group(2)}", "%Y%m%d %H:%M:%S.%f").timestamp()
    return round(when - t_hang, 3)


def summarize(runs: dict, baseline_timeout: float, gloo_s: float, nccl_s: float) -> tuple[dict, dict]:
    """``(projected, ratios)``: torch's defaults projected as the baseline run with its collective
    timeout replaced by theirs (each of its times + default - ``baseline_timeout``), and each
    watchdog run's times as fractions of the baseline's and the projections'."""
    base = runs["collective_timeout"]
    keys = ("collective_error_s", "detect_s", "first_step_s")
    projected = {name: {k: round(base[k] + default - baseline_timeout, 3) for k in keys if base.get(k) is not None}
                 for name, default in (("gloo", gloo_s), ("nccl", nccl_s))}
    ratios = {}
    for name in ("watchdog_derived", "watchdog_5s"):
        w = runs[name]
        r = {"baseline_detect_over_watchdog": round(base["detect_s"] / w["detect_s"], 2),
             "baseline_first_step_over_watchdog": round(base["first_step_s"] / w["first_step_s"], 2)}
        if base.get("collective_error_s"):
            r["baseline_collective_error_over_watchdog_detect"] = round(base["collective_error_s"] / w["detect_s"], 2)
        for k, v in projected.items():
            r[f"torch_default_{k}_detect_over_watchdog"] = round(v["detect_s"] / w["detect_s"], 1)
            r[f"torch_default_{k}_first_step_over_watchdog"] = round(v["first_step_s"] / w["first_step_s"], 1)
        ratios[name] = r
    return projected, ratios


def report(res: dict) -> None:
    if not res.get("runs"):
        return  # --only-early
    for name, r in res["runs"].items():
        print(f"{name:20s} detected {r['detect_s']:7.2f} s after the SIGSTOP ({r['detected_reason']}; torchrun saw a "
              f"worker fail at {r['collective_error_s']} s), first step after recovery {r['first_step_s']:7.2f} s  "
              f"[T {r['hang_timeout_s']} {r['timeout_source'] or ''}, stacks {r['stacks']}, {r['status']}]")
    gloo = res["torch_default_timeout_s"]["gloo"]
    for name, r in res["ratios"].items():
        print(f"{name}: detection {r['baseline_detect_over_watchdog']}x sooner than the baseline's report "
              f"({r.get('baseline_collective_error_over_watchdog_detect')}x than its collective error), "
              f"{r['torch_default_gloo_detect_over_watchdog']}x than with torch's gloo default ({gloo:g} s); back to "
              f"training {r['baseline_first_step_over_watchdog']}x / {r['torch_default_gloo_first_step_over_watchdog']}x sooner")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--hang-at", type=int, default=80)
    p.add_argument("--baseline-timeout", type=float, default=60.0, help="the baseline's collective timeout, s")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--early", action="store_true", help="also the two early-hang runs (rank 1 stopped at step 3)")
    p.add_argument("--only-early", action="store_true", help="only the two early-hang runs")
    p.add_argument("--early-hang-at", type=int, default=3)
    p.add_argument("--out", help="results file (default benchmarks/results/hang_detection.json; with --only-early "
                                 "hang_detection_early.json)")
    p.add_argument("--recompute", action="store_true",
                   help="run nothing: recompute the projections and ratios of the results file --out")
    a = p.parse_args()
    if a.out is None:
        a.out = os.path.join(ROOT, "benchmarks", "results",
                             "hang_detection_early.json" if a.only_early else "hang_detection.json")
    if a.recompute and not a.only_early:
        with open(a.out) as f:
            res = json.load(f)
        t = res["torch_default_timeout_s"]
        res["torch_default_projected"], res["ratios"] = summarize(res["runs"], res["baseline_timeout_s"], t["gloo"],
                                                                  t["nccl"])
    elif a.only_early:
        from hyperpod_lab.submit.client import Client

        res = {"benchmark": "hang_detection", "time": time.time(), "steps": a.steps, "step_sleep_s": a.sleep,
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "baseline_timeout_s": a.baseline_timeout, "runs": {}, "ratios": {},
               "early": measure_early(Client(), a)}
    else:
        res = measure(a)
        if a.early:
            from hyperpod_lab.submit.client import Client

            res["early"] = measure_early(Client(), a)
    report(res)
    if res.get("early"):
        report_early(res["early"])
    write_results(a.out, res, said="results:")


EARLY_STARTUP_S = 10.0


def measure_early(client, a: argparse.Namespace) -> dict:
    """The two early-hang runs and their ratio (baseline over watchdog, same run of this script)."""
    runs = {"early_watchdog": run_once(client, "early_watchdog", None, a.steps, a.sleep, a.early_hang_at,
                                       a.baseline_timeout, a.timeout_s, startup_timeout=EARLY_STARTUP_S),
            "early_collective_timeout": run_once(client, "early_collective_timeout", A_WEEK_S, a.steps, a.sleep,
                                                 a.early_hang_at, a.baseline_timeout, a.timeout_s,
                                                 startup_timeout=A_WEEK_S)}
    w, b = runs["early_watchdog"], runs["early_collective_timeout"]
    return {"startup_timeout_s": EARLY_STARTUP_S, "runs": runs,
            "ratios": {"baseline_detect_over_watchdog": round(b["detect_s"] / w["detect_s"], 2),
                       "baseline_first_step_over_watchdog": round(b["first_step_s"] / w["first_step_s"], 2)}}


def report_early(early: dict) -> None:
    for name, r in early["runs"].items():
        print(f"{name:24s} stopped after step {r['stopped_at_step']}: detected {r['detect_s']:7.2f} s after the "
              f"SIGSTOP ({r['detected_reason']}; T {r['hang_timeout_s']} {r['timeout_source'] or ''}), first step "
              f"after recovery {r['first_step_s']:7.2f} s [{r['status']}]")
    r = early["ratios"]
    print(f"early hang: detection {r['baseline_detect_over_watchdog']}x sooner than the collective timeout, back to "
          f"training {r['baseline_first_step_over_watchdog']}x sooner")


def measure(a: argparse.Namespace) -> dict:
    import torch
    from torch.distributed import constants

    from hyperpod_lab.submit.client import Client

    client = Client()
    runs = {}
    for name, hang_timeout in (("watchdog_derived", None), ("watchdog_5s", 5.0), ("collective_timeout", A_WEEK_S)):
        runs[name] = run_once(client, name, hang_timeout, a.steps, a.sleep, a.hang_at, a.baseline_timeout, a.timeout_s)
        print(f"{name}: {runs[name]}", flush=True)
    gloo_s = constants.default_pg_timeout.total_seconds()
    nccl = getattr(constants, "default_pg_nccl_timeout", None)  # None in a CPU-only torch build
    # torch.distributed.init_process_group(timeout=...): "Default value is 10 minutes for NCCL and
    # 30 minutes for other backends"
    nccl_s = nccl.total_seconds() if nccl is not None else NCCL_DEFAULT_S
    projected, ratios = summarize(runs, a.baseline_timeout, gloo_s, nccl_s)
    return {"benchmark": "hang_detection", "time": time.time(), "torch": torch.__version__,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "steps": a.steps, "step_sleep_s": a.sleep, "hang_at_step": a.hang_at,
            "baseline": f"collective timeout {a.baseline_timeout:g} s (HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S), no watchdog",
            "baseline_timeout_s": a.baseline_timeout,
            "torch_default_timeout_s": {"gloo": gloo_s, "nccl": nccl_s,
                                        "source": "torch.distributed.constants" + ("" if nccl is not None else
                                                  "; NCCL: init_process_group's documented default")},
            "torch_default_projected": projected, "runs": runs, "ratios": ratios}


if __name__ == "__main__":
    main()
