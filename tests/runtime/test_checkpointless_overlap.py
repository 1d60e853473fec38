"""The checkpointless gradient reduction overlapped with the last micro-batch's backward
(``Checkpointless(overlap=True)``, the default for CPU parameters), with real processes on this
host: torchft Lighthouse and Managers, launch agents, gloo. The job is
``tests/scripts/ft_fsdp_train.py`` (an MLP, whole in every rank or FSDP2-sharded within each
replica group; ``--no-overlap`` reduces in ``end_step`` only).

Overlap changes when each bucket's collectives start, not what they sum: both paths cut the same
buckets (reverse parameter order) and reduce them in the same order, so the results must be
bit-equal, at every step, not just close.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from agents import kinds
from test_checkpointless import ROOT, Job, _losses, _replicas_equal
from test_checkpointless_fsdp import FsdpJob, shard_records

STEPS = 8
BUCKET = 4096  # bytes: several buckets for the tests' MLP (width 64: 5,313 parameters)


def _run(tmp_path, procs: int, args: list[str], groups: int = 2) -> FsdpJob:
    # every quorum holds every group (the Lighthouse's min_replicas): a group that started first and
    # stepped alone would give the two runs different histories (seen on a loaded host, load 19)
    return FsdpJob(tmp_path, groups, args, procs=procs, min_replicas=groups).completed(timeout=300)


def _expected_buckets(args: list[str], bucket_bytes: int) -> int:
    """Gradient buckets (without the member vector) of the job's whole (unsharded) model with
    these script arguments, from its parameter sizes."""
    import importlib.util

    from hyperpod_lab.runtime.checkpointless.ft import _layout

    spec = importlib.util.spec_from_file_location("ft_fsdp_train", os.path.join(ROOT, "tests", "scripts",
                                                                                 "ft_fsdp_train.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _, _, model, _ = mod.setup(mod.parse_args(args))
    sizes = [p.numel() for p in model.parameters()]
    return len(_layout([False] * len(sizes), sizes, bucket_bytes // 4))


@pytest.mark.parametrize("procs,fsdp", [(1, False), (2, False), (2, True)],
                         ids=["whole-1rank", "whole-2ranks", "fsdp-2ranks"])
def test_overlapped_reduction_is_bit_equal_to_the_reduction_after_backward(tmp_path, procs, fsdp):
    """2 replica groups, 4 micro-batches a rank a step (global batch 32), 4 KiB buckets. With
    overlap, every gradient bucket of every step after the first was sent during the last
    micro-batch's backward (whole model: all of them, as many as its parameter sizes give); without
    it, none was. The losses, every rank's shards (model and Adam state) at every step, and the
    final parameters are bit-equal between the two runs, and the groups bit-equal to each other.
    Cases: whole replicas of 1 rank (cross-group only), of 2 ranks (the in-group all-reduce first,
    chained to the cross-group one as it completes), FSDP2 over 2 ranks (FSDP2 calls the
    parameters' post-accumulate-grad hooks after its reduce-scatter)."""
    args = ["--steps", str(STEPS), "--bucket-bytes", str(BUCKET)] + (["--fsdp"] if fsdp else [])
    on = _run(tmp_path / "on", procs, args)
    off = _run(tmp_path / "off", procs, args + ["--no-overlap"])

    rec_on, rec_off = shard_records(on.job_dir), shard_records(off.job_dir)
    assert sorted(rec_on) == sorted(rec_off) == [(g, r) for g in range(2) for r in range(procs)]
    expected = None if fsdp else _expected_buckets(args, BUCKET)  # sharded: rank-dependent sizes
    for key in rec_on:
        # "overlapped" in a step's record: buckets of the previous step sent during backward
        sent = [r["overlapped"] for r in rec_on[key] if r["step"] > 0]
        assert len(sent) == STEPS - 1 and min(sent) >= 2, (key, sent)
        if expected is not None:
            assert sent == [expected] * (STEPS - 1), (key, sent, expected)
        assert all(r["overlapped"] == 0 for r in rec_off[key]), (key, rec_off[key])
        digests_on = [(r["step"], r["sha256"]) for r in rec_on[key]]
        digests_off = [(r["step"], r["sha256"]) for r in rec_off[key]]
        assert digests_on == digests_off, f"{key}: shards differ between overlap and no overlap"
    l_on, l_off = _losses(on.events()), _losses(off.events())
    assert sorted(l_on) == list(range(STEPS)) and l_on == l_off, (l_on, l_off)
    a, b = _replicas_equal(on, 0, 1), _replicas_equal(off, 0, 1)
    for k in a:
        assert torch.equal(a[k], b[k]), f"final {k} differs between overlap and no overlap"
    print(f"overlapped buckets per step (group, rank): { {k: v[-1]['overlapped'] for k, v in rec_on.items()} }")


def test_a_group_killed_during_overlapped_steps_is_redone_without_a_hang(tmp_path):
    """2 groups of 1 rank with overlap on, a wider MLP (width 512: 271,873 parameters, in
    buckets of 64 KiB, all sent during backward) and short steps; group 1's worker is SIGKILLed
    mid-run at an unplanned point of a step. The survivor's step fails (its pending all-reduce,
    started during backward or in end_step, breaks), is not committed, and is redone alone at once
    (``fault.detected`` by group 0, ``recovery.completed`` within 5 s); the restarted group heals
    from it and the job completes every step once, both replicas bit-equal."""
    steps = 150  # ~0.15 s a step: the restarted group (10-20 s under load) still finds a live peer
    args = ["--steps", str(steps), "--width", "512", "--bucket-bytes", "65536", "--step-sleep", "0.1"]
    buckets = _expected_buckets(args, 65536)
    job = FsdpJob(tmp_path, 2, args, procs=1)
    t_kill, ev = job.killed_at(9, 1, 0, timeout=240)
    found = [e["data"] for e in kinds(ev, "fault.detected", replica_group=1, detected_by=0) if e["time"] >= t_kill]
    assert found, f"the survivor reported no fault: {kinds(ev, 'fault.detected')}"
    rec = [e["data"] for e in kinds(ev, "recovery.completed", mode="checkpointless") if e["time"] >= t_kill]
    assert rec and rec[0]["downtime_s"] < 5.0, rec
    assert kinds(ev, "checkpoint.restored", tier="replica", replica_group=1), "the restarted group did not heal"
    assert sorted(_losses(ev)) == list(range(steps)), "a step was lost or repeated"
    records = shard_records(job.job_dir)
    assert max(r["overlapped"] for r in records[(0, 0)]) == buckets, (records[(0, 0)][-1], buckets)
    _replicas_equal(job, 0, 1)
    print(f"survivor's failed step: {found[0]['reason'][:200]}; downtime {rec[0]['downtime_s']} s")


MISUSE = textwrap.dedent("""
    import json, os, torch, hyperpod_lab.runtime as hp
    from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches
    from hyperpod_lab.runtime.checkpointless.ft import Checkpointless, GradientsChangedAfterReduction
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    X, Y = torch.randn(64, 8), torch.randn(64, 1)
    out = {}
    with hp.init() as ctx:
        ft = Checkpointless(ctx, model, torch.optim.SGD(model.parameters(), lr=0.1), ElasticBatches(64, 16, 4),
                            checkpoint=False, bucket_bytes=256)
        def backward(plan, extra=False):
            for mb in list(plan.micro_batches) + ([plan.micro_batches[-1]] if extra else []):
                i = torch.tensor(mb)
                (torch.nn.functional.mse_loss(model(X[i]), Y[i]) * plan.weight(len(mb))).backward()
        for case in ("extra-backward", "clip", "replaced", "fine"):
            plan = ft.begin_step()
            backward(plan, extra=case == "extra-backward")
            if case == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            if case == "replaced":
                model[0].bias.grad = model[0].bias.grad.clone()
            try:
                out[case] = {"outcome": "committed" if ft.end_step(0.0) else "dropped"}
            except GradientsChangedAfterReduction as e:
                out[case] = {"outcome": "raised", "message": str(e)}
            out[case].update(step=ft.step, sent=ft.overlapped, micro_batches=len(plan.micro_batches))
        ft.close()
    with open(os.path.join(ctx.job_dir, "misuse.json"), "w") as f:
        json.dump(out, f)
""")


def test_gradients_changed_after_their_bucket_was_sent_drop_the_step_with_the_fix(tmp_path):
    """One replica group of one rank (a real Lighthouse, launch agent and Manager): with overlap
    on, one backward more than ``plan.micro_batches``, clipping the gradients before ``end_step``,
    or replacing a ``p.grad`` would make the sums sent during backward stale; each raises
    ``GradientsChangedAfterReduction`` naming the parameter and the fix (``overlap=False``), and
    the step is not committed (``ft.step`` stays 0); a correct step after them commits."""
    import json

    script = tmp_path / "misuse.py"
    script.write_text(MISUSE)
    job = Job(tmp_path, 0, [])  # the Lighthouse only; the agent of this script:
    try:
        log = open(os.path.join(job.job_dir, "agent-0.log"), "ab")
        agent = subprocess.Popen([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
                                  "--nproc-per-node=1", "--max-restarts=0", str(script)],
                                 env=dict(job.env(0), HYPERPOD_LAB_REPLICA_GROUPS="1"), stdout=log,
                                 stderr=subprocess.STDOUT)
        job.agents[0] = agent
        assert agent.wait(timeout=180) == 0, job.logs()
    finally:
        job.stop()
    with open(os.path.join(job.job_dir, "misuse.json")) as f:
        out = json.load(f)
    assert set(out) == {"extra-backward", "clip", "replaced", "fine"}, out
    for case in ("extra-backward", "clip", "replaced"):
        r = out[case]
        assert r["outcome"] == "raised" and r["step"] == 0 and r["sent"] >= 1, (case, r)
        assert "overlap=False" in r["message"], r
    assert "received a gradient after its bucket was sent" in out["extra-backward"]["message"], out["extra-backward"]
    assert "changed after its bucket was sent" in out["clip"]["message"], out["clip"]
    assert "0.bias" in out["replaced"]["message"], out["replaced"]
    assert out["fine"]["outcome"] == "committed" and out["fine"]["step"] == 1, out["fine"]
    assert out["fine"]["sent"] == 2 and out["fine"]["micro_batches"] == 4, out["fine"]  # both buckets
    print(json.dumps(out, indent=1))
