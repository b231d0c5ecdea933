"""The import graph of the `flashdesk` package, every import counted (a function-level one too): no
file-level circles outside the known ones below, which only shrink. The Qt app and the engine never
import each other's insides: the app talks to the engine through `protocol` and a worker process."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "kernels")
# Circles still to break: each kernel's front module and its Triton partner import each other (the
# front dispatches, the partner takes the front's types), and the checker and the launch log.
KNOWN_CIRCLES = {
    frozenset({"kernels.attention", "kernels.attention_triton", "kernels.kv_write"}),
    frozenset({"kernels.linear", "kernels.linear_triton"}),
    frozenset({"kernels.layer_norms", "kernels.layer_norms_triton"}),
    frozenset({"kernels.check", "kernels.launch_log"}),
}


def modules() -> dict[str, Path]:
    found = {path.stem: path for path in ROOT.glob("*.py") if path.stem not in ("setup", "__init__")}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (names without the `flashdesk.` prefix)."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flashdesk"):
                base = node.module.removeprefix("flashdesk").lstrip(".")
                targets = [base] + [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name.removeprefix("flashdesk.") for alias in node.names
                           if alias.name.startswith("flashdesk.")]
            else:
                continue
            graph[name] |= {target for target in targets if target in known and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_new_import_circles():
    graph = import_graph()
    assert {"engine.worker", "engine.tools.cli", "kernels.linear", "app.main"} <= set(graph)
    found = circles(graph)
    assert found - KNOWN_CIRCLES == set(), "new import circles: " + str([sorted(c) for c in found - KNOWN_CIRCLES])
    assert KNOWN_CIRCLES - found == set(), "a known circle is gone: drop it from KNOWN_CIRCLES"


def test_the_app_and_the_engine_do_not_import_each_other():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("app."):
            assert not any(t.startswith(("engine.", "kernels.")) for t in targets), (name, targets)
        if name.startswith(("engine.", "kernels.")):
            assert not any(t.startswith("app.") for t in targets), (name, targets)


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
