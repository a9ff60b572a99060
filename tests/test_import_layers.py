"""The layers hold on the import graph: what importing a module loads, not what its file names.

The graph is read from the source (``ast``): module-level imports, each with the packages above it
(importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``). Imports inside functions and under
``TYPE_CHECKING`` load nothing at import time and are left out, which is what lazy ``__init__``s rely on.
A broken rule fails with the chain of imports that breaks it.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYER_RULES = [  # (every module under this prefix, never loads a module under any of these)
    # envs are kernels of observations and rewards: no model, no agent, no training
    ("ludic.envs", ("ludic.agents", "ludic.inference", "ludic.training", "ludic.interaction", "ludic.distributed")),
    # kernels sit below training and inference: they get what they need passed in
    ("ludic.kernels", ("ludic.training", "ludic.inference", "ludic.distributed")),
    # inference serves tokens; it knows nothing of agents, episodes or how it is trained on
    ("ludic.inference", ("ludic.training", "ludic.distributed", "ludic.agents", "ludic.interaction", "ludic.envs")),
    # preparing a model file needs nothing of Ludic's own above it
    ("ludic.models", ("ludic.training", "ludic.inference", "ludic.distributed", "ludic.agents",
                      "ludic.interaction", "ludic.envs", "ludic.cli")),
    # publishing weights needs no training loop, episodes or agents
    ("ludic.distributed", ("ludic.training", "ludic.envs", "ludic.agents", "ludic.interaction")),
    # the multi-host roles and launch recipes (apps) sit above every library layer
    *[(layer, ("ludic.cluster", "ludic.cli")) for layer in (
        "ludic.envs", "ludic.kernels", "ludic.inference", "ludic.models", "ludic.distributed", "ludic.training",
        "ludic.agents", "ludic.interaction", "ludic.context", "ludic.eval",
    )],
]  # fmt: skip
MODULE_RULES = [  # (importing this module, never loads a module under any of these)
    # the Trainer sees only SAW items from a BatchSource
    ("ludic.training.trainer", (
        "ludic.training.pipeline", "ludic.training.batching", "ludic.envs", "ludic.agents",
        "ludic.interaction", "ludic.quickstart",
    )),
    # the trainer's side of the stream reads items; it does not play episodes
    ("ludic.training.pipeline.batch_source", ("ludic.training.batching", "ludic.envs", "ludic.agents")),
]  # fmt: skip
APPS = ("ludic.quickstart", "ludic.cli")  # only the `ludic quickstart` command may load the quickstart


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _rules() -> list[tuple[str, tuple[str, ...]]]:
    modules = sorted(import_graph())
    rules = [(m, banned) for prefix, banned in LAYER_RULES for m in modules if _under(m, prefix)]
    rules += MODULE_RULES
    rules += [(m, ("ludic.quickstart",)) for m in modules if not any(_under(m, app) for app in APPS)]
    return rules


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name | ast.Attribute) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
    return found


def _with_parents(name: str, modules: set[str]) -> list[str]:
    parts = name.split(".")
    return [p for i in range(1, len(parts) + 1) if (p := ".".join(parts[:i])) in modules]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in (SRC / "ludic").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set(_with_parents(name, set(files))) - {name}
        for node in _top_level_imports(ast.parse(path.read_text(encoding="utf-8"))):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for target in targets:
                edges.update(_with_parents(target, set(files)))
        graph[name] = edges
    return graph


def chain_to(graph: dict[str, set[str]], start: str, banned: tuple[str, ...]) -> list[str] | None:
    """The shortest import chain from ``start`` to a module under ``banned``, or None."""
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        if current != start and any(_under(current, b) for b in banned):
            chain = [current]
            while (step := parent[chain[-1]]) is not None:
                chain.append(step)
            return chain[::-1]
        for nxt in sorted(graph.get(current, ())):
            if nxt not in parent:
                parent[nxt] = current
                queue.append(nxt)
    return None


@pytest.mark.parametrize(("module", "banned"), _rules(), ids=[f"{m}-{b[0]}" for m, b in _rules()])
def test_module_never_loads_the_banned_layers(module: str, banned: tuple[str, ...]) -> None:
    graph = import_graph()
    assert module in graph
    chain = chain_to(graph, module, banned)
    assert chain is None, "import chain breaking the rule: " + " -> ".join(chain or [])


def test_the_graph_sees_an_eager_chain() -> None:
    graph = import_graph()
    assert chain_to(graph, "ludic.training.batching.rollout_engine", ("ludic.envs",)) is not None


def test_every_layer_rule_covers_modules() -> None:
    # a prefix that matches nothing (a folder renamed) would make its rule pass vacuously
    graph = import_graph()
    for prefix, _ in LAYER_RULES:
        assert sum(_under(m, prefix) for m in graph) >= 3, f"the rule for {prefix} covers almost nothing"


def test_the_library_never_imports_the_examples() -> None:
    for path in (SRC / "ludic").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(_under(n, "examples") for n in names), f"{path} imports the examples"
