"""The shape of the house (docs/architecture.md): no import circle in ``hyperpod_lab/`` or in
``src/``, no private name imported across modules, and every module listed in the architecture's
module table.

An import circle is a strongly connected set of modules in the graph of every import a module
makes (top-level or inside a function; ``if TYPE_CHECKING:`` blocks and ``import type`` in
TypeScript count too: they are circles a reader must untangle all the same). An import of a
package that encloses the importer is not an edge: Python imports it first in any case.
"""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_graph(pkg: str = "hyperpod_lab") -> dict[str, list[str]]:
    """``module -> modules of the package it imports`` (dotted names)."""
    mods: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                deps.update(subs)
                if len(subs) < len(node.names):
                    deps.add(node.module)
        graph[name] = sorted(d for d in deps if d in mods and d != name and not name.startswith(d + "."))
    return graph


_TS_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'";]*?\bfrom\s+['"](\.[^'"]+)['"]|^\s*import\s+['"](\.[^'"]+)['"]""",
                        re.M)


def typescript_graph(src: str = "src") -> dict[str, list[str]]:
    """``file -> files it imports`` (paths relative to ``src``; relative imports only)."""
    base = os.path.join(ROOT, src)
    files = {}
    for dirpath, _dirs, names in os.walk(base):
        for f in names:
            if f.endswith((".ts", ".tsx")) and not f.endswith(".d.ts"):
                files[os.path.relpath(os.path.join(dirpath, f), base)] = os.path.join(dirpath, f)
    graph = {}
    for rel, path in files.items():
        deps = set()
        for m in _TS_IMPORT.finditer(open(path).read()):
            target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1) or m.group(2)))
            for cand in (target + ".ts", target + ".tsx", os.path.join(target, "index.ts")):
                if cand in files:
                    deps.add(cand)
                    break
            else:
                raise AssertionError(f"src/{rel} imports {m.group(1) or m.group(2)!r}, which is no file in src/")
        graph[rel] = sorted(deps - {rel})
    return graph


def circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle():
    """The checker itself: a two-module and a three-module circle are found, a chain is not."""
    assert circles({"a": ["b"], "b": ["a"], "c": ["a"]}) == [["a", "b"]]
    assert circles({"a": ["b"], "b": ["c"], "c": ["a"]}) == [["a", "b", "c"]]
    assert circles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_no_import_circle_in_python():
    graph = python_graph()
    assert len(graph) > 80 and "hyperpod_lab.node.supervisor" in graph
    assert circles(graph) == []


def test_no_import_circle_in_typescript():
    graph = typescript_graph()
    assert len(graph) > 20 and "index.ts" in graph
    assert circles(graph) == []


def test_no_private_name_is_imported_across_modules():
    """``from hyperpod_lab.x import _name`` (a module's private helper, or a private module) is a
    contract nobody wrote down: make the name public where another module needs it."""
    bad = []
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "hyperpod_lab")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hyperpod_lab"):
                    names = [a.name for a in node.names if a.name.startswith("_") and a.name not in ("__version__",
                                                                                                  "_version")]
                    if any(part.startswith("_") and part != "_version" for part in node.module.split(".")):
                        names.append(node.module)
                    bad += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {n}" for n in names]
    assert not bad, "\n".join(bad)


def test_the_architecture_table_lists_every_module():
    """docs/architecture.md's module table names each module of hyperpod_lab/ by its path (a package's
    ``__init__.py`` too when it holds code, not only a docstring and re-exports)."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        doc = f.read()
    missing = []
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "hyperpod_lab")):
        for f in files:
            if f.endswith((".py", ".sh")) and f != "__main__.py" and (f != "__init__.py" or os.path.getsize(os.path.join(dirpath, f)) > 2000):  # a package with code
                rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(ROOT, "hyperpod_lab"))
                if f"`{rel}`" not in doc:
                    missing.append(rel)
    assert not missing, "add to docs/architecture.md's module table: " + ", ".join(sorted(missing))
