"""One direction of flow: each layer of the package imports only the layers below it.

    base (errors, files, file_kinds, label_keys, sizes, reference, text_enum, text_table, schemas, versions)
    < recipe < compat < plan < render < engine, oci, artifacts < analysis < pipeline < cli

The pipeline (recipe -> resolution -> plan -> Dockerfile -> build -> push) is put together once,
in ``buildkit_py.pipeline``; a lower layer that reached up (the plan building an image, the
engine inspecting one, the resolver reading the user's cache) would make that assembly happen in
two places again. Imports made only for type checking count too: they are dependencies all the
same. Read from the source with ast, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "buildkit_py"
# lower rank = lower layer; a module may import its own layer and any lower one
LAYERS = {
    **dict.fromkeys(("__init__", "errors", "files", "file_kinds", "label_keys", "sizes", "reference", "text_enum",
                      "text_table", "schemas", "versions"), 0),
    "recipe": 1, "compat": 2, "plan": 3, "render": 4,
    **dict.fromkeys(("engine", "oci", "artifacts"), 5),
    "analysis": 6, "pipeline": 7, "cli": 8, "__main__": 9,
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported buildkit_py module) of every import in a file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "buildkit_py":  # a submodule, or a name of the package itself (__version__)
                out += [(node.lineno, f"buildkit_py.{a.name}" if _is_module(a.name) else "buildkit_py")
                        for a in node.names]
            elif node.module.startswith("buildkit_py."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("buildkit_py.")]
    return out


def _is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()


def upward_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        src = layer_of(module)
        for line, target in imports_of(path):
            dst = layer_of(target)
            if dst != src and LAYERS[dst] > LAYERS[src]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {src} imports {target} ({dst} is above it)")
    return found


def test_every_module_belongs_to_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert names <= set(LAYERS), f"put {sorted(names - set(LAYERS))} in LAYERS"


def test_no_layer_imports_one_above_it():
    assert upward_imports() == []


def test_the_check_finds_an_upward_import(tmp_path, monkeypatch):
    """The rule can fail: a plan module that imports the engine is reported."""
    fake = tmp_path / "buildkit_py"
    (fake / "plan").mkdir(parents=True)
    (fake / "plan" / "x.py").write_text("from buildkit_py.engine.build import run_build\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert upward_imports() == ["buildkit_py/plan/x.py:1: plan imports buildkit_py.engine.build (engine is above it)"]


# --- the CLI draws what the pipeline returns (issue 32: 1) ------------------------------------------

# The CLI's edges into the layers the pipeline assembles (engine, analysis, plan): distinct (cli
# module, imported module) pairs. 37 before the build and the bake folder moved into pipeline/ (issue 32: 1);
# a change may lower this number, never raise it: wire a new step in pipeline/, not in cli/.
CLI_LOWER_EDGES = 26
LOWER = ("engine", "analysis", "plan")
# what `build` used to wire itself: the build, the matrix build, the tests and the SBOM
NOT_FROM_CLI_BUILD = ("buildkit_py.engine.build", "buildkit_py.engine.matrix_build",
                      "buildkit_py.analysis.image_checks", "buildkit_py.analysis.sbom")


def cli_lower_edges() -> set[tuple[str, str]]:
    edges = set()
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        edges |= {(module, target) for _, target in imports_of(path) if layer_of(target) in LOWER}
    return edges


def test_the_cli_edges_into_lower_layers_only_fall():
    edges = cli_lower_edges()
    assert len(edges) <= CLI_LOWER_EDGES, (
        f"cli/ imports {len(edges)} engine/analysis/plan modules, more than {CLI_LOWER_EDGES}: put the new step "
        f"in pipeline/ and call it from the command. Edges: {sorted(edges)}")
    if len(edges) < CLI_LOWER_EDGES:
        print(f"cli -> lower-layer edges fell to {len(edges)}: lower CLI_LOWER_EDGES to lock it in")


def build_steps_imported(path: Path) -> list[str]:
    """The modules of NOT_FROM_CLI_BUILD a file imports, also as ``from buildkit_py.engine import build``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in names if n in NOT_FROM_CLI_BUILD or n.startswith(tuple(f"{m}." for m in NOT_FROM_CLI_BUILD))]


def test_the_build_command_imports_no_build_step(tmp_path):
    assert build_steps_imported(PACKAGE / "cli" / "build.py") == []
    wired = tmp_path / "build.py"  # the check can fail, however the import is spelled
    wired.write_text("from buildkit_py.engine import build\nfrom buildkit_py.analysis.sbom import attach_sbom\n")
    assert build_steps_imported(wired) == ["buildkit_py.engine.build", "buildkit_py.analysis.sbom",
                                           "buildkit_py.analysis.sbom.attach_sbom"]


def test_the_ratchet_counts_a_new_edge(tmp_path, monkeypatch):
    """The ratchet can fail: one more CLI module reaching into the engine is one more edge."""
    fake = tmp_path / "buildkit_py"
    (fake / "cli").mkdir(parents=True)
    (fake / "cli" / "x.py").write_text("from buildkit_py.engine.build import write_context\n"
                                       "from buildkit_py.pipeline.build import build_image\n"
                                       "def f():\n    from buildkit_py.analysis import sbom\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert cli_lower_edges() == {("buildkit_py.cli.x", "buildkit_py.engine.build"),
                                 ("buildkit_py.cli.x", "buildkit_py.analysis")}
