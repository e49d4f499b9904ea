"""No import cycles: the package's import graph, deferred imports included, is acyclic, and the
modules that play games import alone. Imports sit at the top of a file, except a slow library's
(measured: benchmarks/import_time.py) or an optional one's, and the file says so.

A cycle that only closes inside a function still breaks whoever imports the modules in the
"wrong" order, and it makes the playing code one tangle: the rollout, two-player play, the
scheduler and the oracles reach each other only through registries of import paths
(:mod:`aria.llm.registry`, :data:`aria.games.question.oracle.ORACLES`).
"""
import ast
import functools
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "aria"


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its file (top level or in a function)."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        graph[name] = edges
    return graph


def test_the_graph_reader_sees_deferred_imports():
    graph = import_graph()
    assert "aria.llm.local" in graph["aria.experiment.runner"]  # imported in a function there
    assert "aria.scheduler" in graph["aria.games.question.play"]
    assert "aria.scheduler" in graph["aria.games.two_player.play"]


def test_the_package_has_no_import_cycle():
    try:
        list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"import cycle: {' -> '.join(err.args[1])}")


@pytest.mark.parametrize("module", ["aria.scheduler", "aria.games.question.play", "aria.games.two_player.play",
                                    "aria.games.question.oracle", "aria.games.question.knowledge_base",
                                    "aria.games.question.llm_oracle", "aria.games.question.expert",
                                    "aria.llm.registry", "aria.llm.constrained", "aria.games.two_player.offers"])
def test_each_playing_module_imports_alone(module):
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_sub_packages_import_each_other_one_way():
    """games, llm, intention, trainers and experiment, each taken whole: no two import each other
    (intention/grouping.py imported trainers/methods.py, which imports intention/aggregate.py; the
    comparison of groupings now lives with the experiment, above both)."""
    packages = ("aria.games", "aria.llm", "aria.intention", "aria.trainers", "aria.experiment")

    def package(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    graph: dict[str, set[str]] = {p: set() for p in packages}
    for module, targets in import_graph().items():
        if (source := package(module)) is not None:
            graph[source] |= {t for t in map(package, targets) if t is not None and t != source}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"sub-packages import each other: {' -> '.join(err.args[1])}")


def test_no_folder_imports_one_that_imports_it_back():
    """Each folder of the package (its top included) taken whole: the folders import each other in
    one direction. The package's own folder holds the foundation (io, resources, registry...),
    which every folder uses, so no module directly in aria/ may import one of its sub-folders; games/common holds what the game
    families share, so the registry of families (games/family.py) sits above them."""
    def folder(module: str) -> str:
        path = PACKAGE.parent.joinpath(*module.split("."))
        return module if path.is_dir() else module.rpartition(".")[0]

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        graph.setdefault(folder(module), set()).update(folder(t) for t in targets if folder(t) != folder(module))
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"folders import each other: {' -> '.join(err.args[1])}")


@pytest.mark.parametrize("package", ["aria.games", "aria.games.common", "aria.games.question", "aria.games.two_player",
                                     "aria.experiment"])
def test_the_game_folders_import_nothing(package):
    assert import_graph()[package] == set()  # each module is imported by its own path


# ---- imports inside functions: a measured reason or none -------------------------------------------------

IMPORT_TIME = PACKAGE.parent / "benchmarks" / "results" / "import_time.json"
WHERE_USED = "# Imported in the functions that use them"


def slow_libraries() -> dict[str, set[str]]:
    """Each library benchmarks/import_time.py measured, with the slow ones importing it loads: itself
    where it takes the report's ``slow`` seconds or more beyond the libraries it loads, and those of
    them that are slow (``safetensors.torch``: torch, little of its own)."""
    report = json.loads(IMPORT_TIME.read_text())
    slow = {name for name, seconds in report["beyond_loads"].items() if seconds >= report["slow"]}
    return {name: ({name} & slow) | (set(report["loads"][name]) & slow) for name in report["libraries"]}


def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return [alias.name for alias in node.names]


def function_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import inside a function, and whether it is optional (in a ``try`` that catches ImportError)."""
    optional = {id(node) for t in ast.walk(tree) if isinstance(t, ast.Try)
                and any({"ImportError", "ModuleNotFoundError"} & {ast.unparse(e) for e in (
                            h.type.elts if isinstance(h.type, ast.Tuple) else [h.type or ast.Name("BaseException")])}
                        for h in t.handlers)
                for statement in t.body for node in ast.walk(statement)}
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [(node, id(node) in optional) for node in ast.walk(function)
                      if isinstance(node, (ast.Import, ast.ImportFrom)) and (node.module if isinstance(
                          node, ast.ImportFrom) else "") != "__future__"]
    return list({id(node): (node, opt) for node, opt in found}.values())


def slow_reached(names: list[str], files: dict[str, Path], slow: dict[str, set[str]],
                 seen: set[str] | None = None) -> set[str]:
    """The slow libraries importing ``names`` loads: directly, through what those load, or through
    the package's modules' top-level imports."""
    seen = set() if seen is None else seen
    reached = set()
    for name in names:
        for lib in slow:
            if name == lib or name.startswith(lib + "."):
                reached |= slow[lib]
        if name in files and name not in seen:
            seen.add(name)
            reached |= slow_reached(top_level_imports(files[name]), files, slow, seen)
    return reached


@functools.cache
def top_level_imports(path: Path) -> list[str]:
    """What the file at ``path`` imports when it is imported (not inside its functions or classes);
    read once per file, since every module's imports are walked again from each module above it."""
    tree = ast.parse(path.read_text())
    return [t for statement in tree.body for node in ast.walk(statement)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for t in imported_names(node)]


def test_the_slow_libraries_are_measured():
    report = json.loads(IMPORT_TIME.read_text())
    assert report["machine"] and report["libraries"], "benchmarks/import_time.py writes the machine and its figures"
    slow = slow_libraries()
    assert {"torch", "transformers"} <= slow["torch"] | slow["transformers"]
    assert "torch" in slow["safetensors.torch"]  # what a library loads is recorded with it


def deferred(name: str, files: dict[str, Path], slow: dict[str, set[str]]) -> list[tuple[ast.AST, set[str]]]:
    """Each non-optional function-level import of module ``name``, with the slow libraries it loads
    that the module's own top-level imports do not already load (what deferring it saves)."""
    tree = ast.parse(files[name].read_text())
    own = slow_reached([name], files, slow)
    return [(node, slow_reached(imported_names(node), files, slow) - own)
            for node, optional in function_imports(tree) if not optional]


def test_a_function_imports_only_what_is_slow_or_optional():
    files, slow = module_files(), slow_libraries()
    reasonless = [f"{files[name].relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}"
                  for name in files for node, saves in deferred(name, files, slow) if not saves]
    assert not reasonless, ("import at the top of the file (no slow library its top does not load already, no "
                            "optional one):\n" + "\n".join(reasonless))


def test_a_file_that_imports_in_functions_names_the_slow_libraries():
    """The comment names (by package) every library the file's function-level imports keep out of
    its import that is clearly slow (twice the report's ``slow`` seconds beyond what it loads), and
    nothing they do not keep out; one nearer the threshold may be named or not, so that a
    re-measurement does not rewrite comments."""
    files, report = module_files(), json.loads(IMPORT_TIME.read_text())
    clearly = {name for name, seconds in report["beyond_loads"].items() if seconds >= 2 * report["slow"]}
    slow = {name: ({name} | set(loads)) & clearly for name, loads in report["loads"].items()}
    measured = {name: {name} | set(loads) for name, loads in report["loads"].items()}
    wrong = []
    for name, path in files.items():
        required = {lib.split(".")[0] for _, saves in deferred(name, files, slow) for lib in saves}
        allowed = {lib.split(".")[0] for _, saves in deferred(name, files, measured) for lib in saves}
        comment = next((line for line in path.read_text().splitlines() if line.startswith(WHERE_USED)), None)
        named = set(comment.rpartition(": ")[2].rstrip(".").split(", ")) if comment else set()
        if not required <= named <= allowed:
            wrong.append(f"{path.relative_to(PACKAGE.parent)}: keeps out {sorted(required)} (and may name "
                         f"{sorted(allowed - required)}), its comment names {sorted(named)}")
    assert not wrong, f"each file says '{WHERE_USED} (...): PACKAGE, ...' for what it defers:\n" + "\n".join(wrong)


def test_the_import_rule_fails_on_a_light_import_in_a_function(tmp_path):
    tree = ast.parse("def f():\n    import json\n    from aria.llm.policy import load_model\n"
                     "    try:\n        import not_installed\n    except (OSError, ImportError):\n        pass\n")
    imports = function_imports(tree)
    reasons = [(ast.unparse(node), optional, slow_reached(imported_names(node), module_files(), slow_libraries()))
               for node, optional in imports]
    assert reasons[0] == ("import json", False, set())
    assert reasons[1][0].startswith("from aria.llm.policy") and "torch" in reasons[1][2]
    assert reasons[2] == ("import not_installed", True, set())

    # deferring what the file's own top already loads saves nothing: safetensors.torch loads torch
    (tmp_path / "mod.py").write_text("import torch\n\n\ndef save():\n    import safetensors.torch\n\n\n"
                                     "def plot():\n    import matplotlib.pyplot\n")
    files = {**module_files(), "planted": tmp_path / "mod.py"}
    slow = {"torch": {"torch"}, "safetensors.torch": {"torch"}, "matplotlib": {"matplotlib"},
            "matplotlib.pyplot": {"matplotlib", "matplotlib.pyplot"}}  # as the report would say it
    saves = [(ast.unparse(node), saved) for node, saved in deferred("planted", files, slow)]
    assert saves == [("import safetensors.torch", set()), ("import matplotlib.pyplot", {"matplotlib", "matplotlib.pyplot"})]
