"""Package hygiene: light import, curated public surface, layers that only talk downwards."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mhsafeeval"
HEAVY = ("litellm", "vllm", "llama_cpp", "aiosqlite", "openai", "httpx")


def test_import_does_not_pull_heavy_dependencies() -> None:
    code = (
        "import sys, mhsafeeval, mhsafeeval.messages, mhsafeeval.runtime.providers, "
        "mhsafeeval.testing, mhsafeeval.cli\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize(
    "module",
    [
        "mhsafeeval",
        "mhsafeeval.runtime",
        "mhsafeeval.runtime.providers",
        "mhsafeeval.messages",
        "mhsafeeval.testing",
        "mhsafeeval.storage",
        "mhsafeeval.stats",
        "mhsafeeval.judges",
        "mhsafeeval.engine",
        "mhsafeeval.search",
    ],
)
def test_all_lists_exactly_the_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    exported = set(mod.__all__)
    assert all(hasattr(mod, name) for name in exported), exported - set(dir(mod))

    # Every public class or function defined here (or in a private submodule) is exported.
    def own(value: object) -> bool:
        where = getattr(value, "__module__", "") or ""
        return where == module or where.startswith(module + "._")

    public = {
        name
        for name, value in vars(mod).items()
        if not name.startswith("_") and callable(value) and own(value)
    }
    assert public <= exported, public - exported


# Who may import whom (STYLE.md): cli/composition on top; agents, judges, search, storage are
# siblings that talk only through messages; messages and the taxonomy (shared vocabulary: the
# cells every layer names) above runtime; runtime at the bottom.
LAYERS = {
    "runtime": {"runtime", "errors"},
    "messages": {"messages", "runtime", "errors"},
    "config": {"config", "runtime", "errors"},
    "errors": {"errors"},
    "taxonomy": {"taxonomy", "errors"},
    "stats": {"stats"},  # pure statistics, shared by the report, judges and calibration
    "agents": {"agents", "messages", "taxonomy", "runtime", "errors", "config"},
    "judges": {"judges", "messages", "taxonomy", "runtime", "errors", "config", "stats"},
    "search": {"search", "messages", "taxonomy", "runtime", "errors", "config"},
    "storage": {"storage", "messages", "taxonomy", "runtime", "errors", "config", "stats"},
    "testing": {"testing", "runtime", "messages", "errors", "config"},
    # Runs any graph: knows the bus, the lifecycle messages and the store, no agent or search.
    "engine": {"engine", "messages", "runtime", "errors", "storage"},
}
VENDOR_FREE = {"messages", "search", "judges"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


def test_layers_import_only_downwards() -> None:
    problems = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).parts
        layer = rel[0].removesuffix(".py")
        if layer not in LAYERS:
            continue
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "mhsafeeval" and len(parts) > 1:
                target = parts[1]
                if target not in LAYERS[layer] and target != "__init__":
                    problems.append(f"{path.relative_to(SRC)} imports {name}")
            if layer in VENDOR_FREE and parts[0] in HEAVY:
                problems.append(f"{path.relative_to(SRC)} imports vendor SDK {name}")
    assert problems == []


# The top level is what the three uses need (README "Architecture"): graphs, providers and
# controllers as plugins, the engine, the store, the fakes. Everything else is in subpackages.
TOP_LEVEL = {
    "graphs": ["Agent", "AgentId", "HandlerFailed", "Message", "Runtime", "on"],
    "engine": ["Graph", "Node", "RunResult", "run_graph"],
    "providers": [
        "CallParams",
        "ChatMessage",
        "Completion",
        "ModelCallError",
        "ModelClient",
        "ModelSettings",
        "open_model",
        "provider",
    ],
    "controllers": ["SearchController", "controller"],
    "store": ["EventStore", "MemoryEventStore", "SqliteEventStore"],
    "fakes": ["ScriptedModel", "register_script"],
    "errors": ["InputError", "MhSafeEvalError"],
}


def test_the_top_level_exports_exactly_the_three_uses_each_documented_with_an_example() -> None:
    import mhsafeeval

    wanted = sorted([*(n for names in TOP_LEVEL.values() for n in names), "__version__"])
    assert sorted(mhsafeeval.__all__) == wanted
    undocumented = [
        name
        for name in wanted
        if name != "__version__" and ">>>" not in (getattr(mhsafeeval, name).__doc__ or "")
    ]
    assert undocumented == []
