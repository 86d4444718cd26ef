"""The layers of docs/design.md ("Layers"), checked over every module's imports, those inside functions included:
no arrow runs back up a floor, no two modules import each other through any chain, the few third-party
libraries stay in their layers, and an import stays inside a function only with a `# lazy: <reason>`."""
import ast
import functools
import pathlib
from collections import defaultdict

import pytest

PKG = pathlib.Path(__file__).resolve().parents[2] / "autohet_ray"

# Floors, lowest first. A module imports its own layer and layers on lower floors only; layers that share a
# floor do not import each other. A layer is a subpackage of autohet_ray, a module at its root (the `autohet`
# command is the cli package) or "autohet_ray" (the root __init__: ConfigError).
FLOORS = [
    {"autohet_ray"},
    {"config_io", "safe_names", "durable", "layout", "cloud"},    # helpers; chunk algebra; spot notice readers
    {"cluster", "model", "data"},                                 # pure data; token shards
    {"nn", "plan"},                                               # torch modules; plan JSON
    {"profile"},
    {"cost", "runtime", "checkpoint"},                            # pure cost model; torch runtime; checkpoints
    {"planner", "storage"},                                       # SCIP planner; the job's storage
    {"replay"},                                                   # simulated spot replay (cost model + planner)
    {"metrics"},
    {"recovery"},                                                 # pure half of recovery and the controller
    {"job"},                                                      # TrainJob, its plan, stage-in
    {"elastic"},                                                  # Ray side of recovery
    {"emulate"},                                                  # device emulation
    {"orchestrate"},                                              # Ray glue, the controller
    {"testbed"},                                                  # CPU shares, shaped links, a raylet per netns
    {"cli"},
]
FLOOR = {layer: level for level, layers in enumerate(FLOORS) for layer in layers}

# Lower layers a layer must still not import (the design keeps them apart though the floors would allow it).
APART = {
    "cost": {"nn", "data"},                                        # pure and deterministic: no torch code
    "planner": {"nn", "runtime", "checkpoint", "data"},
    "storage": {"cost", "runtime"},
    "replay": {"nn", "runtime", "checkpoint", "data"},             # cost model + planner only, no training code
    "metrics": {"planner", "checkpoint"},
}
THIRD_PARTY_ONLY_IN = {"ray": {"orchestrate", "elastic", "emulate", "cli"}, "pyscipopt": {"planner"},
                       "cvxpy": {"planner"}}

# Inside a layer, its folders on floors of their own, lowest first (a module at the layer's root counts as a folder;
# "" is the layer's __init__). The planner: its answer and the no-fit message; what a search builds, and the bounds;
# the passes; the helper process (it warms up the grouping program); the baselines and the search, which runs the
# passes in order (planner/search.py's PASSES); the public face.
INNER_FLOORS = {
    "planner": [{"result", "no_fit"}, {"candidates", "bounds"}, {"passes"}, {"workers"}, {"baselines", "search"},
                {""}],
}

# (from layer, to layer) -> why it is still there. Each must still occur (a stale entry fails too).
KNOWN_BACK_ARROWS: dict[tuple[str, str], str] = {}

# Files whose function-local imports are not yet marked, each with why (a stale entry fails too).
UNMARKED_LOCAL_IMPORTS: dict[str, str] = {}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "autohet_ray"
    return parts[1]


def _target(name: str) -> str:
    """The module an imported dotted name loads last: itself, or the package that defines the name."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@functools.cache
def imports_of(module: str) -> list[tuple[str, int, bool]]:
    path = MODULES[module]
    return imports_in(path.read_text(), module if path.name == "__init__.py" else module.rsplit(".", 1)[0])


def imports_in(source: str, package: str) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import statement of a module of `package`; for
    `from X import y` the name is X.y when that is a module, else X. Relative imports are resolved."""
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    out.append((sub if sub in MODULES else base, child.lineno, in_function))
            visit(child, inside)

    visit(ast.parse(source), False)
    return out


def internal_edges() -> list[tuple[str, str, int, bool]]:
    """(importer, imported module, line, inside a function) for every import of an autohet_ray module."""
    return [(m, _target(name), line, local) for m in MODULES for name, line, local in imports_of(m)
            if name == "autohet_ray" or name.startswith("autohet_ray.")]


def circles(edges) -> list[list[str]]:
    """Groups of modules that import one another through some chain (strongly connected, more than one)."""
    graph = defaultdict(set)
    for src, dst, _, _ in edges:
        if src != dst:
            graph[src].add(dst)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def back_arrows(edges) -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> the imports that go to the same or a higher floor, or to a layer kept apart."""
    out = defaultdict(list)
    for src, dst, line, local in sorted(set(edges)):
        a, b = layer_of(src), layer_of(dst)
        if a != b and (FLOOR[b] >= FLOOR[a] or b in APART.get(a, ())):
            out[(a, b)].append(f"{MODULES[src].relative_to(PKG.parent)}:{line} imports {dst}"
                               + (" (inside a function)" if local else ""))
    return out


def folder_of(module: str) -> str:
    """The folder (or root module) of a module inside its layer; "" for the layer's __init__."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def inner_back_arrows(edges) -> list[str]:
    """The imports inside a layer of INNER_FLOORS that go to the same or a higher inner floor."""
    out = []
    for src, dst, line, local in sorted(set(edges)):
        layer = layer_of(src)
        if layer != layer_of(dst) or layer not in INNER_FLOORS:
            continue
        floor = {folder: n for n, folders in enumerate(INNER_FLOORS[layer]) for folder in folders}
        a, b = folder_of(src), folder_of(dst)
        if a != b and floor[b] >= floor[a]:
            out.append(f"{MODULES[src].relative_to(PKG.parent)}:{line} imports {dst}"
                       + (" (inside a function)" if local else ""))
    return out


def test_every_folder_of_a_layer_with_inner_floors_has_one():
    for layer, floors in INNER_FLOORS.items():
        folders = {folder_of(m) for m in MODULES if layer_of(m) == layer}
        declared = set().union(*floors)
        assert folders == declared, f"{layer}: give these an inner floor: {sorted(folders - declared)}; " \
                                    f"gone: {sorted(declared - folders)}"


def test_folders_inside_a_layer_import_only_downwards():
    problems = inner_back_arrows(internal_edges())
    assert not problems, "imports that run back up (or across) a layer's inner floors:\n" + "\n".join(problems)
    planted = ("autohet_ray.planner.candidates.split", "autohet_ray.planner.passes.polish", 1, False)
    assert inner_back_arrows([planted]) == [
        "autohet_ray/planner/candidates/split.py:1 imports autohet_ray.planner.passes.polish"]


def test_every_layer_has_a_floor():
    missing = sorted({layer_of(m) for m in MODULES} - set(FLOOR))
    assert not missing, f"give these layers a floor in FLOORS: {missing}"
    assert all(FLOOR[b] < FLOOR[a] for a, kept in APART.items() for b in kept), "APART names only lower layers"


def test_layers_import_only_downwards():
    arrows = back_arrows(internal_edges())
    problems = [line for key, lines in sorted(arrows.items()) if key not in KNOWN_BACK_ARROWS for line in lines]
    assert not problems, "imports that run back up (or across) a floor:\n" + "\n".join(problems)
    stale = sorted(set(KNOWN_BACK_ARROWS) - set(arrows))
    assert not stale, f"these known back-arrows are gone: delete them from KNOWN_BACK_ARROWS: {stale}"


def test_no_import_circles():
    found = circles(internal_edges())
    assert not found, "modules that import each other (through function-local imports too):\n" + "\n".join(
        " <-> ".join(group) for group in found)


def test_third_party_libraries_stay_in_their_layers():
    problems = []
    for module in MODULES:
        for name, line, _ in imports_of(module):
            allowed = THIRD_PARTY_ONLY_IN.get(name.split(".")[0])
            if allowed is not None and layer_of(module) not in allowed:
                problems.append(f"{MODULES[module].relative_to(PKG.parent)}:{line} imports {name} "
                                f"(only in {sorted(allowed)})")
    assert not problems, "\n".join(problems)


def test_function_local_imports_say_why():
    """An import inside a function defers a heavy dependency (torch, Ray, PySCIPOpt, cvxpy, boto3...), and a
    `# lazy: <reason>` comment on its line or the line above says which; any other import is at module level."""
    unmarked = defaultdict(list)
    for module, path in MODULES.items():
        lines = path.read_text().split("\n")
        for name, line, local in imports_of(module):
            above = lines[line - 2].strip() if line > 1 else ""
            if local and "# lazy:" not in lines[line - 1] and not (above.startswith("#") and "# lazy:" in above):
                unmarked[str(path.relative_to(PKG.parent))].append(f"{path.relative_to(PKG.parent)}:{line} {name}")
    problems = [line for file, lines in sorted(unmarked.items()) if file not in UNMARKED_LOCAL_IMPORTS
                for line in lines]
    assert not problems, "function-local imports without a '# lazy: <reason>' (or move them up):\n" + "\n".join(
        problems)
    stale = sorted(set(UNMARKED_LOCAL_IMPORTS) - set(unmarked))
    assert not stale, f"no unmarked local import is left in these: delete them from UNMARKED_LOCAL_IMPORTS: {stale}"


@pytest.mark.parametrize("source, expected", [
    ("from autohet_ray.cluster.spec import Cluster\n", "autohet_ray.cluster.spec"),
    ("def f():\n    from autohet_ray.cluster import spec\n", "autohet_ray.cluster.spec"),
    ("class C:\n    def f(self):\n        import autohet_ray.cluster.spec as s\n", "autohet_ray.cluster.spec"),
    ("from autohet_ray.cluster import Cluster\n", "autohet_ray.cluster"),
    ("from .spec import Cluster\n", "autohet_ray.cluster.spec"),
    ("from ..model import spec\n", "autohet_ray.model.spec"),
])
def test_the_checker_sees_every_form_of_import(source, expected):
    """Each form of import (module level, in a function or method, through the package, relative) is found
    and resolved to the module it loads, as if in a module of autohet_ray/cluster/."""
    found = imports_in(source, "autohet_ray.cluster")
    assert [_target(name) for name, _, _ in found] == [expected]
    assert found[0][2] == source.startswith(("def", "class"))


def test_the_checker_finds_a_planted_back_arrow_and_circle():
    edges = internal_edges()
    planted = ("autohet_ray.cluster.spec", "autohet_ray.orchestrate.controller", 1, True)
    assert ("cluster", "orchestrate") not in back_arrows(edges)
    assert back_arrows(edges + [planted])[("cluster", "orchestrate")] == [
        "autohet_ray/cluster/spec.py:1 imports autohet_ray.orchestrate.controller (inside a function)"]
    assert not circles(edges)
    found = circles(edges + [("autohet_ray.model.shape", "autohet_ray.model.spec", 1, True)])   # the old circle
    assert found == [["autohet_ray.model.hf_config", "autohet_ray.model.shape", "autohet_ray.model.spec"]]
