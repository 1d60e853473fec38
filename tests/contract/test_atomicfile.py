"""hyperpod_lab.atomicfile: the one way a file another process reads is rewritten.

Real files and a real second process: a reader polling the file while a writer rewrites it
with different lengths never sees a partial or empty content.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from hyperpod_lab.atomicfile import write_atomic, write_json_atomic


def test_replaces_whole_with_mode_and_leaves_no_temporary_file(tmp_path):
    p = tmp_path / "record.json"
    p.write_text("old")
    write_json_atomic(str(p), {"b": 1, "a": [1, 2]}, mode=0o600)
    assert p.read_text() == '{"a": [1, 2], "b": 1}\n'  # keys sorted, one newline
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    write_atomic(str(p), b"\x00\x01", mode=0o640, fsync=False)
    assert p.read_bytes() == b"\x00\x01" and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["record.json"]


def test_a_planted_link_is_replaced_never_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep me")
    link = tmp_path / "exit_code"
    link.symlink_to(target)
    write_atomic(str(link), "0\n")
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and link.read_text() == "0\n"


def test_an_error_loses_nothing(tmp_path):
    p = tmp_path / "placement.json"
    p.write_text('{"faults": {}}\n')
    with pytest.raises(TypeError):
        write_json_atomic(str(p), {"x": object()})  # not JSON: nothing written
    with pytest.raises(FileNotFoundError):
        write_atomic(str(tmp_path / "missing-dir" / "f"), "x")
    (tmp_path / "busy").mkdir()
    with pytest.raises(IsADirectoryError):  # the rename fails after the data was written
        write_atomic(str(tmp_path / "busy"), "new")
    assert os.listdir(tmp_path / "busy") == []
    os.rmdir(tmp_path / "busy")
    assert p.read_text() == '{"faults": {}}\n' and os.listdir(tmp_path) == ["placement.json"]


def test_a_concurrent_reader_sees_old_or_new_never_a_part(tmp_path):
    p = tmp_path / "summary.json"
    write_json_atomic(str(p), {"n": 0, "pad": ""})
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from hyperpod_lab.atomicfile import write_json_atomic
        for i in range(1, 400):
            write_json_atomic({str(p)!r}, {{"n": i, "pad": "x" * (i * 997 % 200_000)}}, fsync=False)
    """)])
    seen = set()
    try:
        while writer.poll() is None:
            with open(p) as f:
                d = json.load(f)  # a partial file would raise here
            assert d["pad"] == "x" * (d["n"] * 997 % 200_000)
            seen.add(d["n"])
    finally:
        writer.wait(60)
    assert writer.returncode == 0
    assert json.loads(p.read_text())["n"] == 399 and len(seen) > 1
    assert os.listdir(tmp_path) == ["summary.json"]
