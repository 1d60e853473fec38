"""``hyperpod-lab`` command line. The ``%hyperpod`` magics run this same surface.

Errors a user can cause print one ``error: ...`` line (the problem and the fix) and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, TextIO

from hyperpod_lab.cli.render import EventView, event_line, make_console, table
from hyperpod_lab.errors import HyperPodLabError, SpecError
from hyperpod_lab.jobdir import (
    DEFAULT_FAULT_KIND,
    DEFAULT_SLOW_FACTOR,
    ENV_CLUSTER,
    FAULT_KINDS,
    MAX_SLOW_FACTOR,
    MIN_SLOW_FACTOR,
    FaultKind,
)
from hyperpod_lab.spec import (
    TENSORBOARD_ALL_RANKS,
    TENSORBOARD_OFF,
    TENSORBOARD_RANK0,
    TRACKING_MODES,
    TRACKING_OFF,
    CheckpointPolicy,
    ElasticPolicy,
    JobSpec,
    ResiliencyPolicy,
    parse_elastic,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits; we raise so magics survive
        raise SpecError("arguments", f"{message} (see 'hyperpod-lab {self.prog.split()[-1]} --help')")

    def exit(self, status=0, message=None):
        if message:
            self._print_message(message, sys.stderr)
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status):
        self.status = status


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hyperpod-lab", description="Submit resilient PyTorch training from a notebook to "
                "Slurm (over SSH) or local torchrun, and watch its events.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    dc = sub.add_parser("dev-cluster", help="the local dev Slurm cluster (munge, slurmctld, 3 slurmd, "
                        "slurmdbd, sshd, bastion, shared dir)")
    dc.add_argument("action", choices=["up", "down", "status"])
    dc.add_argument("--nodes", type=_int, default=3, help="up: slurmd nodes n1..nN, 2 to 32 (default 3)")
    dc.add_argument("--cpus", type=_int, default=None,
                    help="up: CPUs each node declares, 1 to 64 (default: this host's); e.g. 8 to place 8 "
                         "processes a node on a smaller host")

    cl = sub.add_parser("clusters", help="list cluster profiles, or discover HyperPod clusters: "
                        "clusters discover [--region R] [--profile P] [--write]")
    cl.add_argument("action", nargs="?", choices=["list", "discover"], default="list")
    cl.add_argument("--json", action="store_true")
    cl.add_argument("--region", help="discover: AWS region (default: $AWS_REGION / your AWS config)")
    cl.add_argument("--profile", help="discover: AWS named profile (default: $AWS_PROFILE / default chain)")
    cl.add_argument("--endpoint-url", help="discover: SageMaker API endpoint override")
    cl.add_argument("--write", action="store_true", help="discover: write a cluster profile per cluster")
    cl.add_argument("--overwrite", action="store_true", help="discover --write: replace profiles of the same name")

    s = sub.add_parser("submit", help="submit a training script: submit SCRIPT [options] [-- ARGS]")
    s.add_argument("script")
    s.add_argument("--cluster", default=os.environ.get(ENV_CLUSTER, "local"),
                   help=f"cluster profile (default: ${ENV_CLUSTER} or 'local')")
    s.add_argument("--nodes", type=_int, help="nodes (default: the cluster's default)")
    s.add_argument("--procs-per-node", type=_int, help="ranks per node (default: the cluster's default)")
    s.add_argument("--name", help="job name (default: the script's file name)")
    s.add_argument("--partition")
    s.add_argument("--time", type=_int, dest="time_limit_min", help="time limit, minutes")
    s.add_argument("--exclusive", action=argparse.BooleanOptionalAction, default=None,
                   help="Slurm: nodes not shared with other jobs (default: on when the cluster has GPUs)")
    s.add_argument("--container-image", metavar="IMAGE",
                   help="Slurm: run the training step in this container through pyxis/enroot, e.g. "
                        "nvcr.io/nvidia/pytorch:25.01-py3 or /fsx/images/train.sqsh (default: the cluster's "
                        "container_image; docs/containers.md)")
    s.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the ranks (written to the job's files: not for secrets)")
    s.add_argument("--secret-env", action="append", default=[], metavar="KEY",
                   help="pass KEY's value from this process's environment to the ranks without writing it to "
                        "any file, script, record or log (e.g. --secret-env HF_TOKEN)")
    s.add_argument("--max-retries", type=_int, default=ResiliencyPolicy.max_retries)
    s.add_argument("--no-auto-resume", action="store_true", help="fail on the first fault")
    s.add_argument("--deep-health-check", action="store_true",
                   help="EKS: run only on HyperPod nodes that passed a deep health check")
    s.add_argument("--spares", type=_int, default=0, metavar="K",
                   help="ask for K spare nodes beyond --nodes: a spare takes over a lost or excluded node "
                        "with no requeue (Slurm; EKS: the HyperPodPyTorchJob's spares)")
    s.add_argument("--storm-restarts", type=_int, default=ResiliencyPolicy.storm_restarts, metavar="K",
                   help="stop retrying (exit status 3, no requeue) after K restarts in a row without step "
                        "progress, or K ended by the same fault with no new checkpoint (default 3)")
    s.add_argument("--no-health-checks", action="store_true",
                   help="skip the pre-flight node health checks (GPUs, /dev/shm, shared storage, versions, clock)")
    s.add_argument("--recovery", choices=["restart", "checkpointless"], default="restart",
                   help="restart: every rank restarts from the newest checkpoint; checkpointless: each node is a "
                        "data-parallel replica, survivors go on and a replacement heals from a live peer")
    s.add_argument("--hang-timeout", type=float, metavar="S", dest="hang_timeout_s",
                   help="seconds without step progress after which a rank counts as hung: its stacks go to its "
                        "log, fault.detected {reason: hang}, and it is recovered like a crash (default: "
                        "max(30, 10 x the p99 step time), measured after warm-up)")
    s.add_argument("--startup-timeout", type=float, metavar="S", dest="startup_timeout_s",
                   help="start-up budget: a rank with no progress from hp.init() to its first step for S seconds is "
                        "hung, as is one stalled in its first steps for max(min(30, S), 10 x its slowest step) "
                        "(twice that while it runs: it may wait for a stopped peer; default 600)")
    s.add_argument("--in-process-restarts", type=_int, default=ResiliencyPolicy.in_process_restarts, metavar="N",
                   help="checkpointless: a step that raised is dropped in every replica group and redone in the same "
                        "processes, up to N times per --restart-window; beyond, the rank's process restarts "
                        "(0: always restart the process; default 5)")
    s.add_argument("--restart-window", type=float, default=ResiliencyPolicy.restart_window_s, metavar="S",
                   dest="restart_window_s", help="seconds the in-process budget counts over (default 3600)")
    s.add_argument("--on-straggler", choices=["report", "exclude"], default=ResiliencyPolicy.on_straggler,
                   help="a rank consistently slower than the others: report it (straggler.detected), or also "
                        "exclude its node (Slurm: a spare replaces it, else the next placement avoids it)")
    s.add_argument("--checkpoint-every", type=_int, default=CheckpointPolicy.every_steps, metavar="STEPS")
    s.add_argument("--checkpoint-keep", type=_int, default=CheckpointPolicy.keep_last, metavar="N")
    s.add_argument("--checkpoint-memory-every", type=_int, metavar="STEPS")
    s.add_argument("--checkpoint-s3", metavar="URI")
    s.add_argument("--checkpoint-s3-every", type=_int, metavar="STEPS")
    s.add_argument("--elastic", metavar="MIN:MAX", help="elastic node range")
    s.add_argument("--global-batch-size", type=_int)
    s.add_argument("--lr-rule", choices=["none", "linear", "sqrt"], default=ElasticPolicy.lr_rule)
    s.add_argument("--tensorboard", action="store_const", const=TENSORBOARD_RANK0, default=TENSORBOARD_OFF,
                   help="rank 0 writes the step metrics to TensorBoard event files in <job_dir>/tensorboard "
                        "(needs 'pip install tensorboard'; docs/tensorboard.md)")
    s.add_argument("--tensorboard-all-ranks", action="store_const", const=TENSORBOARD_ALL_RANKS, dest="tensorboard",
                   help="as --tensorboard, every rank into <job_dir>/tensorboard/rank-N")
    s.add_argument("--tracking", choices=TRACKING_MODES, default=TRACKING_OFF,
                   help="mlflow: rank 0 logs the job to one MLflow run (params, step metrics, checkpoint, fault "
                        "and recovery markers, goodput, final state; docs/tracking.md)")
    s.add_argument("--tracking-uri", metavar="URI",
                   help="the MLflow tracking server (default: $MLFLOW_TRACKING_URI here, recorded in the spec)")
    s.add_argument("--dry-run", action="store_true", help="print the rendered submission; submit nothing")
    s.add_argument("--json", action="store_true", help="print the whole job record")
    s.add_argument("--follow", action="store_true", help="stream events until the job finishes")
    s.add_argument("--skip-env-check", action="store_true",
                   help="submit even when the cluster interpreter's hyperpod-lab is missing or incompatible "
                        "(checked on Slurm clusters by default: see 'hyperpod-lab env diff')")

    en = sub.add_parser("env", help="environment parity: env diff --cluster NAME [SCRIPT] (the notebook's Python, "
                        "torch, hyperpod-lab and imported packages against the cluster interpreter's; exit 1 on an "
                        "error-level difference); env export --cluster NAME [--name ENV] (the notebook's pinned "
                        "requirements to the cluster's shared storage, and the command that builds them there)")
    en_sub = en.add_subparsers(dest="env_action", required=True, parser_class=_Parser)
    ed = en_sub.add_parser("diff", help="compare the notebook's environment with the cluster interpreter's")
    ed.add_argument("script", nargs="?", help="the training script whose imported packages are compared")
    ed.add_argument("--container-image", metavar="IMAGE", default=None,
                    help="Slurm: probe this container image's interpreter (pyxis, one srun on a compute node) "
                         "instead of the profile's python; default: the profile's container_image, if any")
    ex = en_sub.add_parser("export", help="write the notebook's pinned requirements to the cluster's shared storage")
    ex.add_argument("--name", default="notebook", help="the environment's name (default 'notebook'): "
                    "<shared_root>/hyperpod-lab/<user>/envs/NAME/requirements.txt")
    for e in (ed, ex):
        e.add_argument("--cluster", default=os.environ.get(ENV_CLUSTER, "local"),
                       help=f"cluster profile (default: ${ENV_CLUSTER} or 'local')")
        e.add_argument("--json", action="store_true")

    j = sub.add_parser("jobs", help="list jobs")
    j.add_argument("--json", action="store_true")

    st = sub.add_parser("status", help="a job's state")
    st.add_argument("job")
    st.add_argument("--json", action="store_true")

    ev = sub.add_parser("events", help="a job's events")
    ev.add_argument("job")
    ev.add_argument("--follow", action="store_true", help="keep streaming until the job finishes")
    ev.add_argument("--json", action="store_true", help="one JSON event per line")
    ev.add_argument("--timeout", type=float, default=None, help="seconds to follow at most")

    lg = sub.add_parser("logs", help="a job's output, or one rank's")
    lg.add_argument("job")
    lg.add_argument("--rank", type=_int)
    lg.add_argument("--triage", action="store_true",
                    help="every rank's log in one view: identical lines collapsed with their ranks "
                         "('[ranks 0-3] loading data...'), then the first failing rank and its traceback "
                         "(read by byte range: --length bytes per rank and file)")
    lg.add_argument("--grep", metavar="PATTERN", help="the ranks' log lines that contain PATTERN (case-insensitive; "
                    "an RE2 regular expression with --regex: linear time, no backreferences or lookaround), "
                    "scanning at most --scan bytes")
    lg.add_argument("--regex", action="store_true", help="--grep PATTERN is a regular expression")
    lg.add_argument("--ranks", help="--triage/--grep: these ranks only, e.g. 0,2-3 (default: all)")
    lg.add_argument("--length", type=_int, default=None, help="--triage: bytes read per rank and file "
                    "(default 64 KiB, at most 1 MiB)")
    lg.add_argument("--scan", type=_int, default=None, help="--grep: most bytes scanned (default 64 MiB)")

    cc = sub.add_parser("cancel", help="cancel a job")
    cc.add_argument("job")

    sc = sub.add_parser("scale", help="add nodes to a running checkpointless job (elastic scale-up)")
    sc.add_argument("job_id")
    sc.add_argument("--add-nodes", type=_int, default=1)

    fi = sub.add_parser("inject-fault", help="fail one rank, to rehearse recovery: SIGKILL its process (--kind kill), "
                        "fail its node (--kind node), make it raise in its training step (--kind exception), "
                        "stop it (--kind hang) or slow it down (--kind slow --factor F)")
    fi.add_argument("job")
    fi.add_argument("--rank", type=_int, required=True)
    fi.add_argument("--kind", choices=FAULT_KINDS, default=DEFAULT_FAULT_KIND,
                    help="kill: SIGKILL the rank's process (default); node: the scheduler loses the rank's node "
                    "(Slurm: scontrol sets it DOWN, needs operator rights; EKS: its pod is deleted); exception: "
                    "the rank raises InjectedFault inside its next training step; hang: SIGSTOP the rank's process "
                    "(the launch agent's watchdog detects the hang and recovers it); slow: the rank's steps take "
                    "--factor times longer (straggler detection flags it)")
    fi.add_argument("--factor", type=float, default=None, metavar="F",
                    help=f"--kind slow: the rank's step time is multiplied by F, {MIN_SLOW_FACTOR:g} to {MAX_SLOW_FACTOR:g} "
                    f"(default {DEFAULT_SLOW_FACTOR:g}; {MIN_SLOW_FACTOR:g} ends it)")
    fi.add_argument("--after-checkpoint", action="store_true",
                    help="wait for the first checkpoint.saved event before injecting the fault")
    fi.add_argument("--timeout", type=float, default=300.0)

    dm = sub.add_parser("demo", help="the main job: dev cluster up, run the example notebook headless, "
                        "print its events and a summary")
    dm.add_argument("--notebook", default="examples/quickstart.ipynb")
    dm.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole notebook")

    gp = sub.add_parser("goodput", help="recommended checkpoint interval and projected goodput per recovery "
                        "mode (and a job's measured goodput with --job)")
    gp.add_argument("--instances", type=_int, required=True, help="instances (nodes) of the job")
    rate = gp.add_mutually_exclusive_group(required=True)
    rate.add_argument("--failure-rate", metavar="RATE",
                      help="failures per instance-hour: a fraction (0.0004), a percentage ('0.04%%') or a range "
                      "LOW:HIGH ('0.01%%:0.06%%'); one value is projected from half to twice it. A bare number above "
                      "0.067 %% per instance-hour (the highest published) is warned about")
    rate.add_argument("--failure-rate-per-day", metavar="N",
                      help="instead of --failure-rate: failures a day of the whole job (all --instances), e.g. 7.76 "
                      "(Llama 3 on 2,048 instances), or LOW:HIGH")
    gp.add_argument("--checkpoint-cost", type=float, metavar="S", help="seconds a checkpoint blocks training "
                    "(default with --job: measured)")
    gp.add_argument("--step-time", type=float, metavar="S", help="seconds per step (default with --job: measured)")
    gp.add_argument("--restart-s", metavar="S", help="seconds to restart the whole job, or LOW:HIGH (default: "
                    "measured with --job, else 900); one value is projected from half to twice it")
    gp.add_argument("--node-loss-fraction", type=float, metavar="F", help="fraction of the failures that take "
                    "their node, and its memory tier, with them (default 1: the projection restores a lost node's "
                    "state from the peer, persistent or s3 tier)")
    gp.add_argument("--detect-s", type=float, help="seconds to detect a failure (default 30)")
    gp.add_argument("--heal-s", type=float, help="checkpointless: seconds peers take to heal (default 90)")
    gp.add_argument("--restore-s", type=float, help="seconds to load a checkpoint (default: the checkpoint cost)")
    gp.add_argument("--replicas", type=_int, help="checkpointless: data-parallel replicas of each state (default 2)")
    gp.add_argument("--fallback-probability", type=float, help="checkpointless: probability a failure falls "
                    "back to the checkpoint (default: from --replicas)")
    gp.add_argument("--work-gpu-hours", type=float, help="useful GPU-hours of the run, to project training days")
    gp.add_argument("--gpus-per-instance", type=_int, default=8)
    gp.add_argument("--job", help="measure this job's events and project them to --instances")
    gp.add_argument("--json", action="store_true")
    gp.add_argument("--plot", metavar="FILE.png", help="write goodput against checkpoint interval to this file "
                    "(in IPython, without --plot, it is shown inline)")
    return p


def spec_from_args(a: argparse.Namespace, script_args: list[str]) -> JobSpec:
    """A JobSpec from ``submit`` flags (cluster defaults fill nodes and procs per node)."""
    from hyperpod_lab.submit.clusters import get_profile

    profile = get_profile(a.cluster)
    env = {}
    for item in a.env:
        if "=" not in item:
            raise SpecError("env", f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        env[k] = v
    lo = hi = None
    if a.elastic is not None:
        lo, hi = parse_elastic(a.elastic)
    nodes = a.nodes if a.nodes is not None else (lo if lo is not None else profile.defaults.nodes)
    return JobSpec(
        script=a.script, name=a.name or os.path.splitext(os.path.basename(a.script))[0] or "train",
        cluster=a.cluster, nodes=nodes,
        procs_per_node=a.procs_per_node if a.procs_per_node is not None else profile.defaults.procs_per_node,
        args=list(script_args), env=env, secret_env=list(dict.fromkeys(a.secret_env)), partition=a.partition,
        time_limit_min=a.time_limit_min, exclusive=a.exclusive,
        resiliency=ResiliencyPolicy(auto_resume=not a.no_auto_resume, max_retries=a.max_retries,
                                    recovery=a.recovery, deep_health_check=a.deep_health_check,
                                    spares=a.spares, health_checks=not a.no_health_checks,
                                    storm_restarts=a.storm_restarts,
                                    hang_timeout_s=a.hang_timeout_s, on_straggler=a.on_straggler,
                                    startup_timeout_s=a.startup_timeout_s,
                                    in_process_restarts=a.in_process_restarts,
                                    restart_window_s=a.restart_window_s),
        checkpoint=CheckpointPolicy(every_steps=a.checkpoint_every, keep_last=a.checkpoint_keep,
                                    memory_every_steps=a.checkpoint_memory_every, s3_uri=a.checkpoint_s3,
                                    s3_every_steps=a.checkpoint_s3_every),
        elastic=ElasticPolicy(min_nodes=lo, max_nodes=hi, global_batch_size=a.global_batch_size,
                              lr_rule=a.lr_rule),
        tensorboard=a.tensorboard, tracking=a.tracking, tracking_uri=a.tracking_uri,
        container_image=a.container_image,
    ).validate()


def run(argv: list[str], out: TextIO | None = None, client=None, console=None) -> Any:
    """Run one command. Returns a value for the magics (the job id for ``submit``).

    Args:
        argv: the command line after ``hyperpod-lab`` (a ``--`` starts the script's arguments).
        out: where output goes (default: stdout).
        client: the :class:`~hyperpod_lab.submit.client.Client` (default: a new one).
        console: a ``rich`` Console for ``--follow``'s progress bar and summary table (default:
            one on ``out`` when it is a terminal; plain lines otherwise; :mod:`hyperpod_lab.cli.render`).

    Raises HyperPodLabError (and SpecError) for bad input; ``main`` turns them into exit 2.
    """
    out = out or sys.stdout
    say: Callable[[str], None] = lambda s: (out.write(s + "\n"), out.flush())  # noqa: E731
    script_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, script_args = argv[:i], argv[i + 1:]
    try:
        a = build_parser().parse_args(argv)
    except _Exit as e:
        return e.status

    if a.cmd == "dev-cluster":
        from hyperpod_lab import devcluster

        if a.action == "up":
            prof = devcluster.up(nodes=a.nodes, cpus=a.cpus)
            say(f"cluster profile '{prof.name}' written: login {prof.user}@{prof.host}:{prof.port}, "
                f"shared storage {prof.shared_root}")
        elif a.action == "down":
            devcluster.down()
        else:
            st = devcluster.status()
            say(json.dumps(st, indent=2, default=str))
            if not st.get("ok", False):
                raise HyperPodLabError("the dev cluster is not fully up; run 'hyperpod-lab dev-cluster up'")
        return None

    if a.cmd == "clusters" and a.action == "discover":
        return _discover(a, say)

    if a.cmd == "clusters":
        from hyperpod_lab.submit.clusters import config_path, load_profiles

        profs = load_profiles()
        if a.json:
            say(json.dumps({n: {"orchestrator": p.orchestrator, "host": p.host, "port": p.port,
                                "shared_root": p.shared_root} for n, p in profs.items()}, indent=2))
        else:
            say(table([[p.name, p.orchestrator, f"{p.host}:{p.port}" if p.host else "-", p.shared_root]
                        for p in profs.values()], ["NAME", "ORCHESTRATOR", "LOGIN", "SHARED ROOT"]))
            say(f"(config: {config_path()})")
        return None

    if a.cmd == "goodput":
        return _goodput(a, say, client)

    from hyperpod_lab.submit.client import Client

    if client is None:
        client = Client()

    if a.cmd == "submit":
        spec = spec_from_args(a, script_args)
        if a.dry_run:
            say(client.render(spec).rstrip("\n"))
            return None
        rec = client.submit(spec, env_check=False if a.skip_env_check else None)
        if a.json:
            say(rec.to_json())
        else:
            say(f"submitted {rec.name!r} to {rec.cluster} ({rec.orchestrator} job {rec.native_id}); "
                f"events: hyperpod-lab events {rec.job_id} --follow")
        if a.follow:
            _follow(client, rec.job_id, say, json_lines=False, timeout_s=None, console=make_console(out, console),
                    spec=rec.spec)
        say(rec.job_id)
        return rec.job_id

    if a.cmd == "env":
        return _env(a, say, client)

    if a.cmd == "jobs":
        recs = client.jobs()
        if a.json:
            say(json.dumps([json.loads(r.to_json()) for r in recs], indent=2))
        else:
            say(table([[r.job_id, r.cluster, r.native_id, r.status,
                         time.strftime("%Y-%m-%d %H:%M", time.localtime(r.submitted_at))] for r in recs],
                       ["JOB", "CLUSTER", "NATIVE ID", "STATE", "SUBMITTED"]))
        return None

    if a.cmd == "status":
        rec = client.status(a.job)
        say(rec.to_json() if a.json else f"{rec.job_id}: {rec.status}"
            + (f" (exit {rec.exit_code})" if rec.exit_code is not None else "")
            + (f" [{rec.reason}]" if rec.reason else ""))
        return rec.status

    if a.cmd == "events":
        spec = client.get(a.job).spec
        if a.follow:
            _follow(client, a.job, say, json_lines=a.json, timeout_s=a.timeout,
                    console=None if a.json else make_console(out, console), spec=spec)
        else:
            from hyperpod_lab.fold.facts import JobFacts

            facts = JobFacts(spec=spec)  # the total steps: the script's --steps N, a step event's total_steps
            for ev in client.event_reader(a.job).poll():
                facts.update(ev)
                say(ev.to_json() if a.json else event_line(ev, facts.total_steps))
        return None

    if a.cmd == "logs" and (a.triage or a.grep):
        from hyperpod_lab.submit import logtriage
        ranks = logtriage.parse_ranks(a.ranks) if a.ranks else ([a.rank] if a.rank is not None else None)
        length = a.length if a.length is not None else logtriage.DEFAULT_LENGTH
        if not 1 <= length <= logtriage.MAX_LENGTH:
            raise SpecError("length", f"must be 1 to {logtriage.MAX_LENGTH} bytes, got {length}")
        if a.grep:
            scan = a.scan if a.scan is not None else logtriage.MAX_SCAN
            if not 1 <= scan <= logtriage.MAX_SCAN:
                raise SpecError("scan", f"must be 1 to {logtriage.MAX_SCAN} bytes, got {scan}")
            res = logtriage.triage(client, a.job, ranks, q=a.grep, regex=a.regex, scan=scan,
                                   limit=logtriage.MAX_MATCHES, failure=False)
            out.write(logtriage.format_matches(res))
        else:
            res = logtriage.triage(client, a.job, ranks, length=length, tail=True)
            out.write(logtriage.format_view(res, res["first_failure"]))
        out.flush()
        return None

    if a.cmd == "logs":
        out.write(client.logs(a.job, a.rank))
        out.flush()
        return None

    if a.cmd == "cancel":
        rec = client.cancel(a.job)
        say(f"cancel requested for {rec.job_id} ({rec.cluster} job {rec.native_id})")
        return None

    if a.cmd == "scale":
        join = client.scale(a.job_id, a.add_nodes)
        say(f"{a.add_nodes} node(s) joining {a.job_id} as replica groups {join['offset']}.."
            f"{join['offset'] + join['nodes'] - 1} (allocation {join['native_id']}); watch for elastic.scaled")
        return join

    if a.cmd == "inject-fault":
        if a.after_checkpoint:
            reader = client.event_reader(a.job)
            deadline = time.monotonic() + a.timeout
            say(f"waiting for the first checkpoint of {a.job} ...")
            while not any(e.kind == "checkpoint.saved" for e in reader.poll()):
                if time.monotonic() > deadline:
                    raise HyperPodLabError(f"no checkpoint.saved event within {a.timeout} s")
                time.sleep(0.5)
        info = client.inject_fault(a.job, a.rank, kind=a.kind, factor=a.factor)
        if a.kind == FaultKind.HANG:
            say(f"stopped rank {a.rank} of {a.job} ({info.get('how')}); the launch agent's watchdog declares it "
                "hung when it has made no progress for its hang timeout")
        elif a.kind == FaultKind.SLOW:
            say(f"rank {a.rank} of {a.job} runs {info['factor']:g}x slower from its next step (request {info['path']})")
        elif a.kind == FaultKind.NODE:
            say(f"failed node {info['node']} of rank {a.rank} of {a.job}: {info['how']}")
        elif a.kind == FaultKind.EXCEPTION:
            say(f"rank {a.rank} of {a.job} raises InjectedFault at its next step (request {info['path']})")
        elif "pod" in info:
            say(f"deleted pod {info['pod']} of rank {a.rank} (node {info.get('node')}) of {a.job}")
        else:
            say(f"killed rank {a.rank} (pid {info['pid']} on node {info['node']}) of {a.job} with SIGKILL")
        return None

    if a.cmd == "demo":
        from hyperpod_lab.cli.demo import run_demo

        return run_demo(a.notebook, say, timeout_s=a.timeout)
    raise AssertionError(a.cmd)


def _goodput(a: argparse.Namespace, say, client) -> None:
    """``goodput``: hyperpod_lab.goodput's advice (and measurement of --job) as a table, JSON, plot."""
    from hyperpod_lab import goodput as gp

    measured = projection = None
    costs = {k: getattr(a, k) for k in ("restart_s", "detect_s", "heal_s", "restore_s", "replicas",
                                        "fallback_probability") if getattr(a, k) is not None}
    step_time, cost = a.step_time, a.checkpoint_cost
    if a.job:
        from hyperpod_lab.submit.client import Client

        measured = gp.measure_from_events((client or Client()).event_reader(a.job).poll())
        extra = {} if a.node_loss_fraction is None else {"node_loss_fraction": a.node_loss_fraction}
        projection = gp.project(measured, a.instances, a.failure_rate, failure_rate_per_day=a.failure_rate_per_day,
                                **extra, **{k: v for k, v in costs.items() if k not in ("restore_s",)})
        step_time = step_time if step_time is not None else measured["step_time_s"]
        if cost is None and measured["tiers"]:
            cost = max(t["blocked_s"] for t in measured["tiers"].values())
    if cost is None or step_time is None:
        raise SpecError("goodput", "give --checkpoint-cost SECONDS and --step-time SECONDS "
                        "(or --job JOB to measure them from its events)")
    advice = gp.advise(a.instances, a.failure_rate, cost, step_time, work_gpu_hours=a.work_gpu_hours,
                       gpus_per_instance=a.gpus_per_instance, failure_rate_per_day=a.failure_rate_per_day, **costs)
    for w in dict.fromkeys(advice["warnings"] + (projection or {}).get("warnings", [])):
        print(f"warning: {w.replace('failure_rate ', '--failure-rate ', 1)}", file=sys.stderr)
    if a.json:
        say(json.dumps({"advice": advice, "measured": measured, "projection": projection}, indent=2))
    else:
        say(gp.report_text(advice, measured, projection))
    if a.plot or not a.json:
        fig = gp.plot_goodput_vs_interval(advice)
        if a.plot:
            fig.savefig(a.plot)
            say(f"plot written to {a.plot}")
        else:
            ipython = sys.modules.get("IPython")
            if ipython is not None and ipython.get_ipython() is not None:
                from IPython.display import Image, display

                display(Image(data=gp.figure_png(fig), format="png"))
    return None


def _env(a: argparse.Namespace, say, client) -> int:
    """``env diff`` / ``env export`` (:mod:`hyperpod_lab.submit.envparity`); 1 when diff finds an error."""
    from hyperpod_lab.schedulers import for_profile
    from hyperpod_lab.submit import envparity
    from hyperpod_lab.submit.clusters import get_profile

    profile = get_profile(a.cluster)
    # the cluster's backend (the diff probes itself);
    # for_profile refuses a profile with FILL-IN placeholders, naming them
    remote = for_profile(profile).remote if profile.orchestrator != "eks" else None
    if a.env_action == "export":
        res = envparity.export(profile, a.name, remote=remote)
        if a.json:
            say(json.dumps(res, indent=2))
        else:
            say(f"wrote {res['pins']} pinned requirements to {res['path']} on {profile.name}")
            say("build the environment on the cluster (login node) with:")
            say(f"  {res['command']}")
            say(f"then set python = \"{res['python']}\" in the '{profile.name}' cluster profile")
        return 0
    try:
        report = envparity.env_diff(profile, a.script, remote=remote, container_image=a.container_image)
    except envparity.EnvCheckUnsupported as e:
        say(f"not checked: {e}")
        return 0
    say(json.dumps({k: v for k, v in report.items()}, indent=2) if a.json else envparity.format_table(report))
    return 1 if report["summary"] == envparity.ERROR else 0


def _discover(a: argparse.Namespace, say) -> list:
    """``clusters discover``: HyperPod clusters of a region; with --write, their profiles."""
    from hyperpod_lab.submit.discovery import discover_clusters, write_profiles

    found = discover_clusters(region=a.region, profile=a.profile, endpoint_url=a.endpoint_url)
    if a.json:
        say(json.dumps([c.to_dict() for c in found], indent=2, default=str))
    elif not found:
        say(f"no HyperPod clusters in region {a.region or '(default)'}; clusters are regional: try --region")
    else:
        say(table([[c.name, c.orchestrator, c.status, c.region,
                     ", ".join(f"{g['name']}:{g['instance_type']} {g['current_count']}/{g['target_count']}"
                               for g in c.instance_groups),
                     ", ".join(f"{k} {v}" for k, v in sorted(c.node_health.items())) or "-"] for c in found],
                   ["NAME", "ORCHESTRATOR", "STATUS", "REGION", "INSTANCE GROUPS (current/target)", "NODES"]))
        notes = {c.events_note for c in found if c.events_note}
        for note in sorted(notes):
            say(f"(cluster events: {note})")
    if a.write:
        from hyperpod_lab.submit.clusters import config_path, get_profile

        for name, what in write_profiles(found, overwrite=a.overwrite):
            todo = get_profile(name).unfilled()
            say(f"profile '{name}': {what}" + (f"; fill in {', '.join(todo)} in {config_path()}" if todo else ""))
    return found


def _follow(client, job_id, say, json_lines: bool, timeout_s, console=None, spec: dict | None = None) -> list:
    """Show the job's events until it finishes (:class:`~hyperpod_lab.cli.render.EventView`: a
    progress bar on ``console``, else plain lines; JSON lines with ``json_lines``), then its summary."""
    with EventView(say, console=console, spec=spec, json_lines=json_lines) as view:
        for ev in client.follow(job_id, timeout_s=timeout_s):
            view.show(ev)
    view.summary()
    return view.events


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        res = run(argv)
    except (HyperPodLabError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return res if isinstance(res, int) else 0


if __name__ == "__main__":
    sys.exit(main())
