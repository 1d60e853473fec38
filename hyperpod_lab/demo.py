"""``hyperpod-lab demo``: the main job, end to end.

Brings the local dev cluster up, executes the example notebook headless (nbclient, a real
kernel), and meanwhile prints every event of every job the notebook submits, as it arrives;
ends with a summary per job (steps, checkpoints, faults, recoveries, wall time).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable

from hyperpod_lab.errors import HyperPodLabError


def execute_notebook(path: str, timeout_s: float, cwd: str | None = None):
    """Run every cell of a notebook in a fresh kernel; return the executed notebook.
    Raises nbclient's CellExecutionError on the first failing cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=int(timeout_s), kernel_name="python3",
                   resources={"metadata": {"path": cwd or os.path.dirname(os.path.abspath(path))}}).execute()
    return nb


def run_demo(notebook: str, say: Callable[[str], None], timeout_s: float = 900.0) -> int:
    """Returns 0 when the notebook ran and every job it submitted completed, else 1."""
    from hyperpod_lab import devcluster
    from hyperpod_lab.client import Client, summarize

    if not os.path.isfile(notebook):
        raise HyperPodLabError(f"notebook {notebook} not found; run the demo from the hyperpod-lab checkout "
                               f"or pass --notebook PATH")
    t0 = time.time()
    say("== dev cluster")
    devcluster.up()
    client = Client()
    before = {r.job_id for r in client.store.list()}
    result: dict = {}

    def worker():
        try:
            result["nb"] = execute_notebook(notebook, timeout_s)
        except Exception as e:  # reported below, with the cell's error
            result["error"] = e

    say(f"== executing {notebook} headless")
    th = threading.Thread(target=worker, daemon=True)
    th.start()
    readers, events, done = {}, {}, set()
    while True:
        for rec in client.store.list():
            if rec.job_id not in before and rec.job_id not in readers:
                readers[rec.job_id] = client.event_reader(rec.job_id)
                events[rec.job_id] = []
                say(f"-- job {rec.job_id} on {rec.cluster} ({rec.orchestrator} {rec.native_id})")
        for jid, reader in readers.items():
            for ev in reader.poll():
                events[jid].append(ev)
                say(f"[{jid[:28]}] {ev.describe()}")
                if ev.kind == "finished":
                    done.add(jid)
        if not th.is_alive() and set(readers) <= done:
            break
        if not th.is_alive() and time.time() - t0 > timeout_s:
            break
        time.sleep(0.3)
    th.join()
    ok = "error" not in result
    say("== summary")
    for jid, evs in events.items():
        try:  # the runtime's 'finished' comes moments before the scheduler's own end state
            rec = client.wait(jid, timeout_s=120)
        except TimeoutError:
            rec = client.status(jid)
        s = summarize(evs)
        ok = ok and rec.status == "completed"
        say(f"{jid}: {rec.status}; " + json.dumps(s))
    say(f"demo wall time {time.time() - t0:.1f} s")
    if "error" in result:
        say(f"notebook failed: {str(result['error'])[-2000:]}")
    return 0 if ok else 1
