"""The example notebook, executed headless in a real kernel, against the real dev cluster."""

import os

from hyperpod_lab.cli.demo import execute_notebook
from hyperpod_lab.submit.client import Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quickstart_notebook_submits_survives_fault_and_reports(dev_cluster):
    client = Client()
    before = {r.job_id for r in client.store.list()}
    nb = execute_notebook(os.path.join(REPO, "examples", "quickstart.ipynb"), timeout_s=600)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "error:" not in text, text[-3000:]
    new = [r for r in client.store.list() if r.job_id not in before]
    slurm = [r for r in new if r.cluster == "local-slurm"]
    local = [r for r in new if r.cluster == "local"]
    assert len(slurm) == 1 and len(local) == 1, [r.job_id for r in new]
    rec = client.wait(slurm[0].job_id, timeout_s=120)
    assert rec.status == "completed"
    events = client.event_reader(rec.job_id).poll()
    kinds = [e.kind for e in events]
    order = ["submitted", "started", "checkpoint.saved", "fault.detected", "recovery.completed", "finished"]
    idx = [kinds.index(k) for k in order]
    assert idx == sorted(idx), kinds
    steps = [e for e in events if e.kind == "step"]
    fin = events[kinds.index("finished")]
    assert fin.data["final_loss"] < steps[0].data["loss"]
    # the notebook printed the events as they arrived and the summary
    assert "fault.detected" in text and "recovery.completed" in text and "summary:" in text
    assert "#SBATCH --nodes=2" in text  # the dry run showed the sbatch script
