"""Tests of the example training job ``examples/train_lm.py``: the model, the corpus, real runs.

In-process (about 3 s): the model's size and shapes, the corpus file (deterministic bytes,
atomic, reused when present) and its memory-mapped train/held-out split. The data path the script
uses (``hp.NodeCache``, ``hp.token_loader``) has its own tests in ``tests/runtime/test_data.py``.

Real runs of the script as the cluster would start it (about 40 s on 2 idle CPU cores):

* one process, default model, ``--steps 24``, the corpus in ``$HYPERPOD_LAB_SHARED_ROOT/datasets``
  (the default location); the loss must fall from about ln 256 and the job must finish;
* the same command again in the same job directory: it restores the step-19 checkpoint (the
  loader's position included) and must reproduce steps 20..23 of the first run exactly;
* two ranks under ``python -m hyperpod_lab.node.launch --standalone --nproc-per-node 2``
  (torchrun plus events), DDP over gloo, ``--d-model 128`` to keep it short; only rank 0 logs,
  the loss falls, the job finishes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_lm.py")
STEP_LINE = re.compile(r"^step (\d+) loss (\d+\.\d+) tok/s (\d+)$", re.M)
FINAL_LINE = re.compile(r"^final loss (\d+\.\d+) eval_loss (\d+\.\d+)$", re.M)
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def lm():
    """The example script imported as a module (its ``__main__`` guard keeps it from training)."""
    spec = importlib.util.spec_from_file_location("train_lm_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def corpus(lm, tmp_path_factory):
    """A corpus built once for the in-process tests."""
    return lm.build_corpus(tmp_path_factory.mktemp("corpus") / lm.CORPUS_NAME)


# ---- model ---------------------------------------------------------------------------------
def test_default_model_has_a_few_million_parameters(lm):
    args = lm.parse_args([])
    torch.manual_seed(0)
    model = lm.ByteLM(args.d_model, args.n_layers, args.n_heads, max_seq=args.seq_len)
    n = lm.count_params(model)
    assert 1_000_000 <= n <= 10_000_000, n
    assert model.head.weight is model.tok.weight  # tied embeddings, counted once
    x = torch.randint(0, 256, (2, args.seq_len))
    assert model(x).shape == (2, args.seq_len, 256)
    # an untrained byte model is close to uniform: loss ~ ln 256
    y = torch.randint(0, 256, (2, args.seq_len), generator=torch.Generator().manual_seed(1))
    assert abs(lm.lm_loss(model, x, y).item() - math.log(256)) < 0.3


def test_attention_is_causal(lm):
    torch.manual_seed(0)
    model = lm.ByteLM(64, 2, 4, max_seq=16).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256  # change only the future of position 9
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[0, :10], b[0, :10], atol=1e-5)
    assert not torch.allclose(a[0, 10:], b[0, 10:], atol=1e-5)


def test_lr_schedule_warms_up_then_decays(lm):
    lrs = [lm.lr_at(s, 60, 3e-3, 6) for s in range(60)]
    assert lrs[0] < lrs[5] == pytest.approx(3e-3)
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:]))
    assert lrs[-1] == pytest.approx(3e-4, rel=0.05)


# ---- corpus --------------------------------------------------------------------------------
def test_corpus_is_deterministic_atomic_and_reused(lm, corpus, tmp_path):
    other = lm.build_corpus(tmp_path / "b" / lm.CORPUS_NAME)
    assert corpus.read_bytes() == other.read_bytes()
    assert corpus.stat().st_size == lm.CORPUS_CAP_BYTES  # the stdlib is larger than the cap
    assert os.listdir(other.parent) == [lm.CORPUS_NAME]  # no temporary file left behind
    # present -> reused as is, not rebuilt
    os.utime(other, (1, 1))
    assert lm.build_corpus(other) == other and other.stat().st_mtime == 1
    text = corpus.read_bytes()[:4096]
    assert b"import " in text or b"def " in text  # Python source, not noise

    # a small cap truncates the same byte stream
    small = lm.build_corpus(tmp_path / "small.u8", cap=10_000)
    assert small.read_bytes() == corpus.read_bytes()[:10_000]


def test_stdlib_sources_exclude_third_party_packages(lm):
    files = lm.stdlib_sources()
    assert len(files) > 500
    assert not any("site-packages" in p.parts or "dist-packages" in p.parts for p in files)
    assert all(p.suffix == ".py" for p in files)


def test_split_is_memory_mapped_and_holds_out_the_last_five_percent(lm, corpus):
    train, heldout = lm.load_corpus(corpus)
    assert isinstance(train, np.memmap) and train.dtype == np.uint8
    assert len(train) + len(heldout) == corpus.stat().st_size
    assert len(heldout) == pytest.approx(0.05 * corpus.stat().st_size, abs=1)
    x, y = lm.windows(heldout, [0, 100], 32)  # the evaluation's windows
    assert x.shape == y.shape == (2, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one byte
    assert bytes(x[1].tolist()) == bytes(heldout[100:132])


# ---- real runs -----------------------------------------------------------------------------
def _env(tmp_path, job: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HYPERPOD_LAB_JOB_DIR"] = str(tmp_path / job)
    env["HYPERPOD_LAB_JOB_ID"] = f"test-{job}"
    for k in ("HYPERPOD_LAB_SPEC", "HYPERPOD_LAB_SHARED_ROOT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> str:
    p = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-4000:]}"
    return p.stdout


def _steps(out: str) -> dict[int, float]:
    """{step: loss} from rank 0's log; each step logged exactly once."""
    found = [(int(s), float(loss)) for s, loss, _ in STEP_LINE.findall(out)]
    steps = dict(found)
    assert len(steps) == len(found), f"a step was logged twice (by two ranks?):\n{out[-3000:]}"
    return steps


def _finished(job_dir) -> dict:
    with open(os.path.join(job_dir, "events", "rank-0.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    done = [e for e in events if e["kind"] == "finished"]
    assert len(done) == 1, events[-3:]
    return done[0]["data"]


def _assert_learns(steps: dict[int, float], n: int, out: str) -> float:
    assert sorted(steps) == list(range(n)), out[-3000:]
    losses = [steps[i] for i in range(n)]
    first, tail = losses[0], sum(losses[-5:]) / 5
    assert 5.0 < first < 5.8, f"first loss {first} should be about ln 256 = 5.55"
    assert tail < first - 1.2, f"loss did not go down: first {first}, mean of last five {tail}: {losses}"
    m = FINAL_LINE.search(out)
    assert m, out[-3000:]
    eval_loss = float(m.group(2))
    assert eval_loss < first - 1.2, (first, eval_loss)
    return eval_loss


def test_single_process_run_learns_finishes_and_resumes_exactly(tmp_path):
    shared = tmp_path / "shared"
    env = _env(tmp_path, "single", HYPERPOD_LAB_SHARED_ROOT=str(shared))
    out = _run([sys.executable, SCRIPT, "--steps", "24"], env)
    steps = _steps(out)
    eval_loss = _assert_learns(steps, 24, out)
    # the corpus went to the default location under the shared root
    assert (shared / "datasets" / "stdlib-bytes-v1.u8").stat().st_size == 8 << 20
    fin = _finished(tmp_path / "single")
    assert fin["status"] == "succeeded" and fin["steps"] == 24
    assert fin["eval_loss"] == pytest.approx(eval_loss, abs=1e-4)
    assert fin["final_loss"] == pytest.approx(steps[23], abs=1e-4)
    assert (tmp_path / "single" / "checkpoints" / "step-00000019" / "COMMITTED").exists()

    # a second start in the same job directory (same arguments: the LR schedule depends on
    # --steps) resumes after step 19's checkpoint and sees the same data: identical losses
    resumed = _run([sys.executable, SCRIPT, "--steps", "24"], env)
    again = _steps(resumed)
    assert "resumed at step 20" in resumed and sorted(again) == [20, 21, 22, 23], resumed[-3000:]
    for s in again:
        assert again[s] == pytest.approx(steps[s], abs=2e-4), (s, again[s], steps[s])


def test_two_ranks_under_the_launcher_learn_and_finish(tmp_path):
    env = _env(tmp_path, "ddp", OMP_NUM_THREADS="1")
    out = _run([sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nproc-per-node", "2",
                SCRIPT, "--steps", "20", "--d-model", "128", "--data-dir", str(tmp_path / "data")], env)
    assert "world 2" in out, out[-3000:]
    steps = _steps(out)  # rank 0 only: each step once
    eval_loss = _assert_learns(steps, 20, out)
    fin = _finished(tmp_path / "ddp")
    assert fin["status"] == "succeeded" and fin["steps"] == 20
    assert fin["eval_loss"] == pytest.approx(eval_loss, abs=1e-4)
    ranks = sorted(os.listdir(tmp_path / "ddp" / "ranks"))
    assert ranks == ["rank-0.json", "rank-1.json"]
