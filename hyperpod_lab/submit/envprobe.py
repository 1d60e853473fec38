"""The environment probe: what one Python interpreter has (standard library only, self-contained).

Run in-process for the notebook's side (:func:`probe`) and, for a cluster's, as ``python -I -c
<this file's source> MODULES_JSON`` through the cluster's command seam (one exec over SSH, see
:mod:`hyperpod_lab.submit.envparity`). It imports nothing but the standard library at module level, so
it answers even where hyperpod-lab or torch is missing or broken, and it never imports torch
(its version comes from the package metadata, its CUDA build from ``torch/version.py`` read as
text and parsed with :mod:`ast`). It prints one JSON object (:func:`probe`'s) on standard output.
"""

import ast
import json
import os
import platform
import sys

PROBE_VERSION = 1


def _metadata():
    import importlib.metadata as md

    return md


def _dist_version(name):
    try:
        return _metadata().version(name)
    except Exception:  # PackageNotFoundError, or a broken dist-info
        return None


def _package_dir(module):
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except Exception:
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    if locs:
        return locs[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _constant(path, name):
    """The literal assigned to ``name`` at the top level of the file ``path`` (None if absent)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _torch():
    version = _dist_version("torch")
    where = _package_dir("torch")
    if version is None and where is None:
        return None
    cuda = None
    if where is not None:
        cuda = _constant(os.path.join(where, "version.py"), "cuda")
        if version is None:
            version = _constant(os.path.join(where, "version.py"), "__version__")
    return {"version": version, "cuda": cuda if isinstance(cuda, str) else None}


def _hyperpod_lab():
    out = {"version": _dist_version("hyperpod-lab"), "schema": None, "error": None}
    try:
        import hyperpod_lab
        from hyperpod_lab import events

        out["schema"] = int(events.SCHEMA_VERSION)
        out["version"] = str(getattr(hyperpod_lab, "__version__", None) or out["version"])
    except Exception as e:  # missing (ModuleNotFoundError) or broken
        if out["version"] is None and isinstance(e, ModuleNotFoundError) and e.name == "hyperpod_lab":
            return None
        out["error"] = f"{type(e).__name__}: {e}"[:500]
    return out


def _modules(names):
    out = {}
    if not names:
        return out
    try:
        by_module = _metadata().packages_distributions()
    except Exception:
        by_module = {}
    for name in names:
        found = _package_dir(name) is not None
        dists = {}
        for dist in by_module.get(name) or [name]:  # an editable install is often not mapped: try the name
            v = _dist_version(dist)
            if v is not None:
                dists[dist] = v
        out[name] = {"found": found or bool(dists), "dists": dists}
    return out


def probe(modules=()):
    """This interpreter's environment.

    Args:
        modules: top-level module names to look up (``numpy``, ``yaml``).

    Returns:
        ``{"probe": 1, "executable", "python" ("3.11.7"), "platform" ("linux-x86_64"), "torch":
        {"version", "cuda" (None: a CPU build)} or None (not installed), "hyperpod_lab":
        {"version", "schema" (event schema version), "error" (import failure, or None)} or None
        (not installed), "modules": {name: {"found": bool, "dists": {distribution: version}}}}``.
    """
    return {"probe": PROBE_VERSION, "executable": sys.executable, "python": platform.python_version(),
            "platform": f"{sys.platform}-{platform.machine()}", "torch": _torch(),
            "hyperpod_lab": _hyperpod_lab(), "modules": _modules(sorted(set(modules)))}


def main(argv):
    try:
        names = json.loads(argv[0]) if argv else []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError
    except ValueError:
        sys.stderr.write("usage: probe MODULES_JSON (a JSON list of module names)\n")
        return 2
    sys.stdout.write(json.dumps(probe(names)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
