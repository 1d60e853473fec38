"""The CLI and the %hyperpod / %%hyperpod magics: one surface, run for real."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
HYPERPOD_LAB = os.path.join(os.path.dirname(sys.executable), "hyperpod-lab")

CELL = """
import hyperpod_lab.runtime as hp
import torch
with hp.init() as ctx:
    w = torch.zeros(1)
    for step in range(3):
        w += 1
        ctx.step(step, loss=float(3 - step))
    ctx.finish(final_loss=float(w.item()))
"""


@pytest.fixture
def shell(ipython):
    return ipython


def test_console_script_submit_dry_run_and_json(dev_cluster, tmp_path):
    env = dict(os.environ, HYPERPOD_LAB_DATA_DIR=str(tmp_path / "data"))
    p = subprocess.run([HYPERPOD_LAB, "submit", EXAMPLE, "--cluster", "local-slurm", "--dry-run", "--", "--steps", "5"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert "#SBATCH --nodes=2" in p.stdout and "--steps 5" in p.stdout and "# submit with: sbatch" in p.stdout
    assert not os.path.exists(tmp_path / "data" / "jobs") or os.listdir(tmp_path / "data" / "jobs") == []
    p = subprocess.run([HYPERPOD_LAB, "submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "1", "--json",
                        "--", "--steps", "3"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    job_id = lines[-1]
    record = json.loads("\n".join(lines[:-1]))
    assert record["job_id"] == job_id and record["cluster"] == "local-slurm"
    p = subprocess.run([HYPERPOD_LAB, "events", job_id, "--follow", "--json", "--timeout", "240"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    kinds = [json.loads(line)["kind"] for line in p.stdout.splitlines()]
    assert kinds[0] == "submitted" and kinds[-1] == "finished"
    p = subprocess.run([HYPERPOD_LAB, "jobs"], capture_output=True, text=True, env=env)
    assert job_id in p.stdout


def test_cell_magic_runs_the_cell_locally_with_torchrun(shell, capsys):
    job_id = shell.run_cell_magic("hyperpod", "run --local --nproc 2 --name cellrun", CELL)
    out = capsys.readouterr().out
    assert job_id and job_id.startswith("cellrun-")
    assert "started" in out and "finished" in out and "summary: succeeded" in out
    from hyperpod_lab.submit.client import Client

    events = Client().event_reader(job_id).poll()
    assert [e for e in events if e.kind == "started"][0].data["world_size"] == 2
    assert [e for e in events if e.kind == "finished"][0].data["final_loss"] == 3.0


def test_line_magic_errors_are_messages_not_tracebacks(dev_cluster, shell, capsys):
    assert shell.run_line_magic("hyperpod", "submit nope.py --cluster local-slurm") is None
    err = capsys.readouterr().err
    assert "error: script: nope.py does not exist" in err
    assert shell.run_line_magic("hyperpod", "submit x.py --cluster nowhere") is None
    assert "unknown cluster 'nowhere'" in capsys.readouterr().err
    assert shell.run_cell_magic("hyperpod", "run --nproc 2", CELL) is None
    assert "add --local" in capsys.readouterr().err


def test_checkpoint_flags_reach_the_spec():
    from hyperpod_lab.cli import build_parser, spec_from_args

    a = build_parser().parse_args(["submit", EXAMPLE, "--cluster", "local", "--checkpoint-memory-every", "2",
                                   "--checkpoint-every", "10", "--checkpoint-s3", "s3://bkt/ckpt",
                                   "--checkpoint-s3-every", "20", "--checkpoint-keep", "3"])
    c = spec_from_args(a, []).checkpoint
    assert (c.memory_every_steps, c.every_steps, c.s3_uri, c.s3_every_steps, c.keep_last) == (2, 10, "s3://bkt/ckpt", 20, 3)
