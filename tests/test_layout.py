"""The package's layout (the architecture issue's rules): one concept per file, no file in
``estimator/`` or ``rules/`` over 600 lines, no function body over 80 lines without a reason in
its docstring, and no import cycle anywhere, counting every import a module makes (top level,
inside functions, and under ``TYPE_CHECKING``: a type-only cycle is a cycle of concepts)."""

from __future__ import annotations

import ast
import os

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, str]:
    """Dotted module name -> path, for estimator/ and rules/ (installed as estimator.rules)."""
    out = {}
    for top, name in (("estimator", "estimator"), ("rules", "estimator.rules")):
        base = os.path.join(ROOT, top)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                    dotted = name if rel == "__init__" else f"{name}.{rel.removesuffix('.__init__')}"
                    out[dotted] = os.path.join(dirpath, f)
    return out


def import_graph() -> nx.DiGraph:
    """Module -> the project modules it imports.  ``from . import x`` imports ``pkg.x`` when ``x`` is a
    module (else ``pkg``); ``from .m import name`` imports ``pkg.m`` (and ``pkg.m.name`` if that is a
    module).  Python's implicit import of a module's parent package is not an edge: only what the
    code writes."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
                found = subs if (node.module is None and subs) else [target, *subs]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for t in found:
                if t in modules and t != name:
                    graph.add_edge(name, t)
    return graph


def test_no_import_cycles():
    graph = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    detail = []
    for comp in cycles:
        sub = graph.subgraph(comp)
        detail += [" -> ".join(c + [c[0]]) for c in list(nx.simple_cycles(sub))[:5]]
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(detail)


def test_the_cycle_check_sees_type_only_and_function_level_imports(tmp_path, monkeypatch):
    # the check must not be blind to the two ways the old cycles hid: an import under TYPE_CHECKING and one
    # inside a function
    pkg = tmp_path / "estimator"
    pkg.mkdir()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("def f():\n    from .a import A\n")
    monkeypatch.setitem(globals(), "ROOT", str(tmp_path))
    graph = import_graph()
    assert graph.has_edge("estimator.a", "estimator.b") and graph.has_edge("estimator.b", "estimator.a")


@pytest.mark.parametrize("name,path", sorted(_modules().items()))
def test_file_and_function_sizes(name, path):
    text = open(path).read()
    lines = text.count("\n")
    assert lines <= MAX_FILE_LINES, f"{name}: {lines} lines (split it along its concepts; at most {MAX_FILE_LINES})"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            first = node.body[1] if ast.get_docstring(node) is not None and len(node.body) > 1 else node.body[0]
            body = node.end_lineno - first.lineno + 1
            assert body <= MAX_FUNCTION_LINES or "Why this length" in doc, (
                f"{name}.{node.name}: {body} lines of body (split it, or say 'Why this length' in its docstring)")


def test_the_planner_never_imports_the_command_line():
    graph = import_graph()
    for name in graph:
        if name.startswith("estimator.plan"):
            assert not graph.has_edge(name, "estimator.cli"), name
