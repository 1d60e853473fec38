"""A malformed or hostile notebook is bad input: 400 naming the problem, never 500 (issue 24, finding 12).

Reproduced on the code before the fix, with a real jupyter-server (tests/jupyter_server_proc.py)
and notebook files in its root submitted through ``POST hyperpod/jobs {"notebook": ...}``: a
deeply nested file raised RecursionError and a code cell whose ``source`` list held a number
raised TypeError (both 500); a code cell whose ``source`` was a number or an object, a notebook of
nbformat 5, and a 65 MiB notebook were accepted (the number or the object's repr became the
script, and a job ran it). The one parser now is ``notebook_script.load_notebook`` (size, UTF-8,
JSON, nesting) followed by ``notebook_to_script`` (nbformat 4, cells, cell types, sources); every
refusal is SpecError (field ``notebook``).
"""

from __future__ import annotations

import json
import os

import pytest
from jupyter_server_proc import JupyterServer

from hyperpod_lab.errors import SpecError
from hyperpod_lab.submit.notebook_script import MAX_NOTEBOOK_BYTES, load_notebook, notebook_to_script


def _nb(cells, nbformat=4):
    return json.dumps({"nbformat": nbformat, "nbformat_minor": 5, "metadata": {}, "cells": cells}).encode()


def _code(source):
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


#: file name -> (bytes, a word the error message must contain)
HOSTILE = {
    "not_json.ipynb": (b"{this is not json", "not JSON"),
    "not_utf8.ipynb": (_nb([_code("print('x')")]).replace(b"print", b"pr\xff\xfent"), "not UTF-8"),
    "deep.ipynb": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "deep_in_cell.ipynb": (_nb([_code("print(1)")])[:-1] + b', "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                           "nested too deeply"),
    "array.ipynb": (b"[1, 2, 3]", "not a notebook"),
    "nbformat5.ipynb": (_nb([_code("print('v5')")], nbformat=5), "nbformat 5"),
    "nbformat_text.ipynb": (_nb([_code("print('v4')")], nbformat="4"), "nbformat '4'"),
    "cells_dict.ipynb": (json.dumps({"nbformat": 4, "cells": {"0": _code("x")}}).encode(), "not a Jupyter notebook"),
    "cell_number.ipynb": (_nb([_code("print(1)"), 7]), "cell 2 is a int"),
    "cell_type_list.ipynb": (_nb([{"cell_type": ["code"], "source": "print(1)"}]), "cell 1 has cell_type"),
    "source_number.ipynb": (_nb([_code(5)]), "cell 1's source"),
    "source_object.ipynb": (_nb([_code({"import os": 1})]), "cell 1's source"),
    "source_list_number.ipynb": (_nb([_code(["print(1)\n", 2])]), "cell 1's source"),
    "source_nested_list.ipynb": (_nb([_code([["print(1)"]])]), "cell 1's source"),
    "too_big.ipynb": (_nb([_code("print(1)"), {"cell_type": "markdown", "source": "x" * (MAX_NOTEBOOK_BYTES + 1)}]),
                      "more than the"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    for name, (data, _) in HOSTILE.items():
        (root / name).write_bytes(data)
    (root / "good.ipynb").write_bytes(_nb([_code(["%load_ext hyperpod_lab\n", "print('fine')\n"])]))
    srv = JupyterServer(str(root), str(tmp_path_factory.mktemp("server"))).start()
    yield srv
    srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def _jobs(srv):
    status, body = srv.call("GET", "/hyperpod/jobs")
    assert status == 200, body
    return {j["job_id"] for j in body["jobs"]}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_notebook_is_400_naming_the_problem(server, name):
    before = _jobs(server)
    status, body = server.call("POST", "/hyperpod/jobs", {"spec": {"cluster": "local", "nodes": 1,
                                                                   "procs_per_node": 1}, "notebook": name})
    assert status == 400, (status, str(body)[:2000])
    err = body["error"]
    assert err["type"] == "SpecError" and err["field"] == "notebook", err
    assert HOSTILE[name][1] in err["message"], err["message"]
    assert len(err["message"]) < 1000  # names the problem; never echoes the document
    assert _jobs(server) == before  # nothing ran
    scripts = os.path.join(server.root_dir, ".hyperpod", "notebooks")
    assert not any(f.startswith(name.split(".")[0] + "-") for f in os.listdir(scripts)) if os.path.isdir(scripts) \
        else True


def test_a_good_notebook_still_converts():
    nb = load_notebook(_nb([_code(["%load_ext hyperpod_lab\n", "print('fine')\n"]), {"cell_type": "markdown",
                                                                                       "source": ["# hi"]}]))
    assert notebook_to_script(nb) == "# cell 1\nprint('fine')\n"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_parser_raises_only_spec_errors(name):
    """In-process, the same files: load + convert raise SpecError (field notebook), nothing else."""
    with pytest.raises(SpecError) as e:
        notebook_to_script(load_notebook(HOSTILE[name][0], name))
    assert e.value.field == "notebook" and HOSTILE[name][1] in str(e.value)


@pytest.mark.parametrize("name", ["deep.ipynb", "deep_in_cell.ipynb", "not_utf8.ipynb", "source_list_number.ipynb",
                                  "too_big.ipynb"])
def test_the_environment_check_reads_a_notebook_the_same_way(server, name):
    """``GET clusters/<name>/env?script=x.ipynb`` reads the notebook's imports through the same
    parser (before the fix, a deeply nested one was a 500 there too)."""
    status, body = server.call("GET", f"/hyperpod/clusters/local/env?script={name}")
    assert status == 400, (status, str(body)[:2000])
    assert body["error"]["field"] == "script" and HOSTILE[name][1] in body["error"]["message"], body
