"""No import cycles: the package's import graph, deferred imports included, is acyclic, and the
modules that play games import alone.

A cycle that only closes inside a function still breaks whoever imports the modules in the
"wrong" order, and it makes the playing code one tangle: the rollout, two-player play, the
scheduler and the oracles reach each other only through registries of import paths
(:mod:`aria.llm.registry`, :data:`aria.games.question.oracle.ORACLES`).
"""
import ast
import graphlib
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
    assert "aria.games.question.knowledge_base" in graph["aria.games.question.expert"]  # imported in a function there
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
    one direction. The top holds the foundation (io, resources, registry...), which every folder
    uses, so no module at the top may import a folder below it; games/common holds what the game
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
