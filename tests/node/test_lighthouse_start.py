"""The job's Lighthouse starts even when its host is slow to start it (found by the 16-node run,
tests/runtime/test_scale16_slurm.py): ``torchft_lighthouse``'s entry point imports torch
(``from torchft._torchft import lighthouse_main`` runs ``torchft/__init__``), which took more than
the 10 s that ``lighthouse.start`` used to wait while 17 nodes' health checks imported torch on the
same host; the groups then found no ``lighthouse.json`` and every rank failed."""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from hyperpod_lab.node import lighthouse

SLOW_S = 11.0  # more than the old 10 s limit


def test_a_lighthouse_that_takes_longer_than_10_s_to_listen_still_starts(tmp_path, monkeypatch):
    """The real ``torchft_lighthouse``, started SLOW_S seconds late by a wrapper (as a host busy
    importing torch starts it): ``start`` waits for it and publishes its address. Before the fix
    (a 10 s limit) this raised 'torchft_lighthouse did not start on port ...'."""
    real = lighthouse.lighthouse_binary()
    wrapper = tmp_path / "slow_lighthouse"
    wrapper.write_text(f"#!/bin/sh\nsleep {SLOW_S}\nexec {sys.executable} {real} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(lighthouse, "lighthouse_binary", lambda: str(wrapper))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    t0 = time.monotonic()
    proc = lighthouse.start(str(job_dir), 1, host="127.0.0.1")
    try:
        waited = time.monotonic() - t0
        assert SLOW_S <= waited < lighthouse.START_TIMEOUT_S, waited
        with open(os.path.join(job_dir, "lighthouse.json")) as f:
            assert json.load(f)["address"].startswith("http://127.0.0.1:")
    finally:
        proc.kill()
        proc.wait()


def test_a_lighthouse_that_exits_fails_at_once_with_its_status(tmp_path, monkeypatch):
    wrapper = tmp_path / "broken_lighthouse"
    wrapper.write_text("#!/bin/sh\nexit 7\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(lighthouse, "lighthouse_binary", lambda: str(wrapper))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 7 before listening"):
        lighthouse.start(str(tmp_path), 1, host="127.0.0.1")
    assert time.monotonic() - t0 < 5
