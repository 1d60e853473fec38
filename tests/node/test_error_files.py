"""A worker's torn error file does not take its node's launch agent down.

torchrun's agent parses each failed worker's ``$TORCHELASTIC_ERROR_FILE`` when it reaps it
(``ProcessFailure.__post_init__``: ``json.load``), and a ``JSONDecodeError`` there escaped the
agent: seen on the dev cluster with 8 ranks a node (tests/runtime/test_shape8.py, 2026-11-27):
rank 9 was SIGKILLed, the node's other ranks' collectives failed, each began writing its
exception as the agent's SIGTERM stopped it, one file was left empty, and the agent died instead
of restarting the ranks (the supervisor then replaced the whole node's group). Real launches of
``hyperpod_lab.node.launch`` (torchrun's agent) on this host.
"""

import json
import os

from agents import launch_standalone

from hyperpod_lab.node.launch import _drop_torn_error_files
from hyperpod_lab.runtime.context import _record_exception

# attempt 0: local rank 1 leaves an empty error file (as a worker stopped mid-write does) and
# fails; local rank 0 waits to be stopped. attempt 1 (the agent's restart): both succeed.
SCRIPT = """
import os, sys, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["LOCAL_RANK"] == "1":
        open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()
        sys.exit(1)
    time.sleep(60)
open(os.path.join(os.path.dirname(__file__), "done-" + os.environ["RANK"]), "w").close()
"""


def test_the_agent_restarts_workers_after_one_left_an_empty_error_file(tmp_path):
    r = launch_standalone(tmp_path, SCRIPT, 2, "torn", timeout_s=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "error file was torn" in r.stderr and "Traceback" not in r.stderr.split("error file was torn")[1][:200]
    assert (tmp_path / "done-0").exists() and (tmp_path / "done-1").exists()
    faults = [json.loads(line) for name in os.listdir(tmp_path / "job" / "events") if name.startswith("agent-")
              for line in open(tmp_path / "job" / "events" / name) if '"fault.detected"' in line]
    assert any(f["data"].get("rank") == 1 for f in faults), faults  # the failure still reported


def test_torn_error_files_are_dropped_and_whole_ones_kept(tmp_path):
    class PContext:
        error_files = {0: str(tmp_path / "0.json"), 1: str(tmp_path / "1.json"), 2: str(tmp_path / "missing.json"),
                       3: os.devnull}

    (tmp_path / "0.json").write_text('{"message": {"message": "RuntimeError: x"}}')
    (tmp_path / "1.json").write_text('{"message": {"mes')
    assert _drop_torn_error_files(PContext())
    assert (tmp_path / "0.json").exists() and not (tmp_path / "1.json").exists()
    assert not _drop_torn_error_files(PContext())


def test_the_runtime_writes_its_error_file_whole_or_not_at_all(tmp_path, monkeypatch):
    """``_record_exception`` (a rank's ``with hp.init()`` that ends in an exception) writes
    through a temporary file renamed over ``$TORCHELASTIC_ERROR_FILE``."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise RuntimeError("collective failed")
    except RuntimeError as e:
        _record_exception(e)
    assert json.loads(path.read_text())["message"]["message"] == "RuntimeError: collective failed"
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == str(path)
    assert sorted(os.listdir(tmp_path)) == ["error.json"]  # no temporary file left
