"""The sidebar's notebook submission writes its converted script safely (issue 13, finding 10).

Reproduced on the code before the fix: the script was written before the spec was validated (a
refused submission left a file behind) and through whatever ``.hyperpod/notebooks/<name>.py``
was, so a planted symbolic link made the server overwrite a file outside the Jupyter root.
"""

from __future__ import annotations

import json
import os

import pytest

from hyperpod_lab.errors import SpecError
from hyperpod_lab.submit.notebook_script import SCRIPTS_SUBDIR, spec_from_request

NB = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
      "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                 "source": "print('hello')"}]}


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / "nb.ipynb").write_text(json.dumps(NB))
    return r


def test_a_refused_spec_writes_no_script(root):
    with pytest.raises(SpecError, match="nodes"):
        spec_from_request({"spec": {"cluster": "local", "nodes": 0}, "notebook": "nb.ipynb"}, str(root))
    assert not (root / SCRIPTS_SUBDIR).exists() or not os.listdir(root / SCRIPTS_SUBDIR)


def test_a_link_planted_at_the_script_path_is_replaced_not_followed(root, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    first = spec_from_request({"spec": {"cluster": "local"}, "notebook": "nb.ipynb"}, str(root))
    os.remove(first.script)
    os.symlink(victim, first.script)
    again = spec_from_request({"spec": {"cluster": "local"}, "notebook": "nb.ipynb"}, str(root))
    assert again.script == first.script
    assert victim.read_text() == "precious"
    assert not os.path.islink(again.script) and "print('hello')" in open(again.script).read()
    assert oct(os.stat(again.script).st_mode & 0o777) == "0o600"


def test_a_linked_scripts_directory_is_refused(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / ".hyperpod")
    with pytest.raises(SpecError, match="not a directory of the Jupyter root"):
        spec_from_request({"spec": {"cluster": "local"}, "notebook": "nb.ipynb"}, str(root))
    assert os.listdir(elsewhere) == []
