"""Turn a submit request of the sidebar into a JobSpec: the script (or the current notebook,
converted to a script) is resolved inside the server's root directory.

Notebook -> script: the code cells in order; IPython-only lines (``%magic``, ``!shell``,
``%%cell`` magics and ``?`` help) are dropped, because the script runs under plain Python on the
cluster. No user text reaches a shell: the result is a file the scheduler stages over SFTP.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import SpecError
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import get_profile

SCRIPTS_SUBDIR = os.path.join(".hyperpod", "notebooks")


#: the largest notebook file a submission reads (bytes); a bigger one is refused (SpecError)
MAX_NOTEBOOK_BYTES = 64 << 20


def load_notebook(data: bytes, what: str = "notebook", field: str = "notebook") -> dict[str, Any]:
    """A notebook file's bytes parsed as JSON (not yet checked as a notebook: see
    :func:`notebook_to_script`). The one parser of notebook files that reach the server.

    Args:
        data: the file's content, at most :data:`MAX_NOTEBOOK_BYTES` bytes.
        what: how the file is named in errors (e.g. its path).
        field: the SpecError field.

    Raises:
        SpecError: ``field``; the file is too big, not UTF-8, not JSON, nested too deeply to be a
            notebook, or not a JSON object. Never anything else.
    """
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise SpecError(field, f"{what} is {len(data)} bytes, more than the {MAX_NOTEBOOK_BYTES} a submission "
                               "reads; clear its outputs (Edit > Clear Outputs of All Cells) or submit a .py script")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(field, f"{what} is not UTF-8 text (byte {e.start}); save it again from Jupyter, which "
                               "writes UTF-8") from None
    try:
        nb = json.loads(text)
    except RecursionError:
        raise SpecError(field, f"{what} is nested too deeply to be a notebook; save it again from Jupyter") from None
    except ValueError as e:
        raise SpecError(field, f"{what} is not JSON ({e}); give a notebook saved by Jupyter (.ipynb)") from None
    if not isinstance(nb, dict):
        raise SpecError(field, f"{what} is JSON but not a notebook (a {type(nb).__name__}, not an object with "
                               "'cells'); give a notebook saved by Jupyter")
    return nb


def read_notebook(path: str, what: str = "notebook", field: str = "notebook") -> dict[str, Any]:
    """:func:`load_notebook` of the file ``path``, reading at most :data:`MAX_NOTEBOOK_BYTES` + 1
    bytes. Raises SpecError(``field``) when it cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_NOTEBOOK_BYTES + 1)
    except OSError as e:
        raise SpecError(field, f"{what} cannot be read ({e.strerror or e})") from None
    return load_notebook(data, what, field)


def notebook_to_script(nb: dict[str, Any], field: str = "notebook") -> str:
    """The code cells of a notebook (nbformat 4 JSON as a dict) as one Python script.

    Cells whose first line is a cell magic (``%%...``) are dropped whole; lines starting with
    ``%``, ``!`` or ending in ``?`` are dropped.

    Raises:
        SpecError: ``field``, naming what is wrong (and the cell, 1-based), for a document that
            is not an nbformat 4 notebook: not an object, ``nbformat`` not 4, ``cells`` not a
            list, a cell not an object, ``cell_type`` not a string, a code cell's ``source``
            neither a string nor a list of strings; or one with no code to run.
    """
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SpecError(field, "is not a Jupyter notebook (nbformat 4 JSON with 'cells'); give a notebook saved by "
                               "Jupyter")
    version = nb.get("nbformat")
    if isinstance(version, bool) or version != 4:
        raise SpecError(field, f"is nbformat {version!r}, not 4; open it in JupyterLab and save it (that converts "
                               "it to nbformat 4)")
    parts = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            raise SpecError(field, f"cell {i + 1} is a {type(cell).__name__}, not an object; the notebook is "
                                   "damaged: save it again from Jupyter")
        kind = cell.get("cell_type")
        if not isinstance(kind, str):
            raise SpecError(field, f"cell {i + 1} has cell_type {kind!r}, not 'code', 'markdown' or 'raw'; the "
                                   "notebook is damaged: save it again from Jupyter")
        if kind != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list) and all(isinstance(x, str) for x in src):
            src = "".join(src)
        elif not isinstance(src, str):
            raise SpecError(field, f"cell {i + 1}'s source is neither text nor a list of lines of text; the "
                                   "notebook is damaged: save it again from Jupyter")
        if src.lstrip().startswith("%%"):
            continue
        lines = [ln for ln in src.splitlines()
                 if not ln.lstrip().startswith(("%", "!")) and not ln.rstrip().endswith("?")]
        body = "\n".join(lines).strip("\n")
        if body:
            parts.append(f"# cell {i + 1}\n{body}\n")
    if not parts:
        raise SpecError(field, "has no code cells to run")
    return "\n".join(parts)


def inside(root: str, rel: str, field: str) -> str:
    if not isinstance(rel, str) or not rel.strip():
        raise SpecError(field, "give a path relative to the Jupyter root directory, e.g. examples/train_lm.py")
    if "\0" in rel:
        raise SpecError(field, "must not contain NUL bytes")
    root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, path]) != root:
        raise SpecError(field, f"{rel!r} is outside the Jupyter root directory; give a path inside it")
    if not os.path.isfile(path):
        raise SpecError(field, f"{rel!r} does not exist in the Jupyter root directory")
    return path


def skip_env_check(body: Any) -> bool:
    """``skip_env_check`` of a ``POST jobs`` body: True submits without the environment check
    (the CLI's ``--skip-env-check``; see :mod:`hyperpod_lab.submit.envparity`). Default False.

    Raises:
        SpecError: field ``skip_env_check`` when it is not a JSON boolean.
    """
    value = body.get("skip_env_check", False) if isinstance(body, dict) else False
    if not isinstance(value, bool):
        raise SpecError("skip_env_check", f"must be true or false, got {value!r}")
    return value


def spec_from_request(body: Any, root_dir: str) -> JobSpec:
    """A validated JobSpec from a ``POST jobs`` body ``{"spec": {...}, "notebook": "a.ipynb"?,
    "skip_env_check": bool?}`` (``skip_env_check`` is the handler's: see :func:`skip_env_check`).

    ``spec.script`` (and ``notebook``) are paths relative to ``root_dir``; with ``notebook``,
    its code cells are written to ``<root_dir>/.hyperpod/notebooks/<stem>-<hash>.py`` and that
    file becomes the script. ``nodes`` and ``procs_per_node`` default to the cluster profile's
    defaults, ``name`` to the script's (or notebook's) file stem.

    Raises:
        SpecError: naming the field (``spec``, ``spec.<field>`` keys are reported by their own
            name as JobSpec does, ``script``, ``notebook``: any malformed or hostile notebook file,
            see :func:`read_notebook` and :func:`notebook_to_script`).
        UnknownCluster, ConfigError: the cluster profile.
    """
    if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
        raise SpecError("spec", 'send {"spec": {...JobSpec fields...}}')
    unknown = set(body) - {"spec", "notebook", "skip_env_check"}
    if unknown:
        raise SpecError(sorted(unknown)[0], "unknown request field; send 'spec' and optionally 'notebook' "
                                            "and 'skip_env_check'")
    spec = dict(body["spec"])
    notebook = body.get("notebook")
    if notebook is not None:
        path = inside(root_dir, notebook, "notebook")
        text = notebook_to_script(read_notebook(path, repr(notebook)))
        stem = os.path.splitext(os.path.basename(path))[0]
        name = f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
        spec["script"] = os.path.join(os.path.realpath(root_dir), SCRIPTS_SUBDIR, name)
        spec.setdefault("name", stem)
        _with_profile_defaults(spec)
        validated = JobSpec.from_dict(spec)  # bad input is refused before anything is written
        _write_new(os.path.join(_private_dir(root_dir, SCRIPTS_SUBDIR), name), text)
        return validated
    if "script" not in spec:
        raise SpecError("script", "is required (a path relative to the Jupyter root directory), or send 'notebook'")
    spec["script"] = inside(root_dir, spec["script"], "script")
    spec.setdefault("name", os.path.splitext(os.path.basename(spec["script"]))[0] or "train")
    _with_profile_defaults(spec)
    return JobSpec.from_dict(spec)


def _with_profile_defaults(spec: dict[str, Any]) -> None:
    cluster = spec.get("cluster")
    if isinstance(cluster, str) and cluster:
        prof = get_profile(cluster)
        spec.setdefault("nodes", prof.defaults.nodes)
        spec.setdefault("procs_per_node", prof.defaults.procs_per_node)


def _private_dir(root_dir: str, sub: str) -> str:
    """``<root_dir>/<sub>``, created (0700) where missing; every part a real directory (no link
    that could lead the write out of the root). Raises SpecError("notebook")."""
    cur = os.path.realpath(root_dir)
    for part in sub.split(os.sep):
        cur = os.path.join(cur, part)
        try:
            os.mkdir(cur, 0o700)
        except FileExistsError:
            pass
        if os.path.islink(cur) or not os.path.isdir(cur):
            raise SpecError("notebook", f"{cur} is not a directory of the Jupyter root (a link or a file); "
                                        "remove it so the converted notebook can be written there")
    return cur


def _write_new(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a fresh temporary file renamed over it (a link planted at
    ``path`` is replaced, never followed)."""
    write_atomic(path, text, mode=0o600, fsync=False)
