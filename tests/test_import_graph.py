"""The import graph of the `flashdesk` package, every run-time import counted (a function-level one
too; those under `if TYPE_CHECKING:` only name types): no file-level circles. The Qt app and the
engine never import each other's insides: the app talks to the engine through `protocol` and a
worker process."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "kernels")


def modules() -> dict[str, Path]:
    found = {path.stem: path for path in ROOT.glob("*.py") if path.stem not in ("setup", "__init__")}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def run_time_imports(tree: ast.AST):
    """The import statements of a module, but those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in run_time_imports(ast.Module([child], [])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from run_time_imports(node)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (names without the `flashdesk.` prefix)."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        for node in run_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flashdesk"):
                base = node.module.removeprefix("flashdesk").lstrip(".")
                targets = [base] + [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [
                    alias.name.removeprefix("flashdesk.") for alias in node.names if alias.name.startswith("flashdesk.")
                ]
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


def test_no_import_circles():
    graph = import_graph()
    assert {"engine.worker", "engine.cli.main", "kernels.linear", "app.main"} <= set(graph)
    assert "kernels.check" in graph["kernels.launch_log"]  # an import inside a function counts
    assert circles(graph) == set(), [sorted(c) for c in circles(graph)]


# engine/'s folders from the bottom up: a module imports only from its own layer or those below
ENGINE_LAYERS = ("errors", "model", "loading", "decode", "hub", "bench", "serve", "cli", "worker")


def engine_layer(module: str) -> int:
    return ENGINE_LAYERS.index(module.split(".")[1])


def test_no_arrow_points_up_inside_the_engine():
    graph = import_graph()
    engine = [m for m in graph if m.startswith("engine.")]
    assert {m.split(".")[1] for m in engine} == set(ENGINE_LAYERS)  # every folder has its place
    upward = sorted(
        f"{a} -> {b}" for a in engine for b in graph[a] if b.startswith("engine.") and engine_layer(b) > engine_layer(a)
    )
    assert upward == [], upward


def test_the_app_and_the_engine_do_not_import_each_other():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("app."):
            assert not any(t.startswith(("engine.", "kernels.")) for t in targets), (name, targets)
        if name.startswith(("engine.", "kernels.")):
            assert not any(t.startswith("app.") for t in targets), (name, targets)


def test_a_circle_is_found_and_type_only_imports_are_not_arrows():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import y\nelse:\n    import z\ndef f():\n    import w\n")
    assert [node.names[0].name for node in run_time_imports(tree)] == ["x", "z", "w"]


def test_the_engine_api_is_exported_and_loads_torch_only_when_used():
    import subprocess
    import sys

    code = (
        "import sys, flashdesk.engine as e; assert 'torch' not in sys.modules; "
        "from flashdesk.engine import Engine, FinishEvent, GenerationRequest, SamplingParams, SpecControl, "
        "StepEvent; assert Engine.load and 'torch' in sys.modules; "
        "assert sorted(e.__all__) == ['Engine', 'FinishEvent', 'GenerationRequest', 'SamplingParams', "
        "'SpecControl', 'StepEvent']"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_the_engine_reaches_kernels_only_through_their_dispatchers():
    """Each operation is dispatched in one place (kernels/<op>.py picks Triton or torch): no engine
    module imports a kernels/*_triton module itself."""
    graph = import_graph()
    direct = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a.startswith("engine.")
        for b in targets
        if b.startswith("kernels.") and b.endswith("_triton")
    )
    assert direct == [], direct
