"""The layering rules of docs/design.md ("Layers"), checked by walking every module's imports."""
import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[2] / "autohet_ray"

# package -> autohet_ray subpackages it must not import
FORBIDDEN = {
    "layout": {"cluster", "model", "profile", "cost", "planner", "plan", "nn", "runtime", "checkpoint",
               "orchestrate", "elastic", "emulate", "cli"},
    "cluster": {"profile", "cost", "planner", "plan", "nn", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "model": {"cluster", "profile", "cost", "planner", "plan", "nn", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "profile": {"cost", "planner", "plan", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "plan": {"profile", "cost", "planner", "nn", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "cost": {"planner", "nn", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "planner": {"nn", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "nn": {"cost", "planner", "runtime", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "runtime": {"cost", "planner", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "data": {"cluster", "model", "profile", "cost", "planner", "plan", "nn", "runtime", "checkpoint", "orchestrate",
             "elastic", "emulate", "cli"},
    "checkpoint": {"cost", "planner", "runtime", "orchestrate", "elastic", "emulate", "cli"},
    # plain data and files of a job, step figures, cloud metadata: below the Ray layers
    "job": {"orchestrate", "elastic", "emulate", "cli"},
    "storage": {"cost", "planner", "runtime", "orchestrate", "elastic", "emulate", "cli"},
    "metrics": {"planner", "checkpoint", "orchestrate", "elastic", "emulate", "cli"},
    "cloud": {"cluster", "model", "profile", "cost", "planner", "plan", "nn", "runtime", "checkpoint", "data",
              "orchestrate", "elastic", "emulate", "cli"},
    # the simulated spot replay: cost model + planner only, no Ray, no training code
    "replay": {"nn", "runtime", "checkpoint", "data", "orchestrate", "elastic", "emulate", "cli"},
}
THIRD_PARTY_ONLY_IN = {"ray": {"orchestrate", "elastic", "emulate"}, "pyscipopt": {"planner"}, "cvxpy": {"planner"}}


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_layers_import_only_downwards():
    problems = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        layer = rel[0] if len(rel) > 1 else path.stem
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "autohet_ray" and len(parts) > 1 and parts[1] in FORBIDDEN.get(layer, ()):
                problems.append(f"{path.relative_to(PKG)} imports {name}")
            allowed = THIRD_PARTY_ONLY_IN.get(parts[0])
            if allowed is not None and layer not in allowed:
                problems.append(f"{path.relative_to(PKG)} imports {parts[0]} (only in {sorted(allowed)})")
    assert not problems, "\n".join(problems)
