"""Package hygiene: light import, curated public surface, layers that only talk downwards."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mhsafeeval"
HEAVY = ("litellm", "vllm", "llama_cpp", "aiosqlite", "openai", "httpx", "httpx2", "aiohttp", "ray")


def test_import_does_not_pull_heavy_dependencies() -> None:
    code = (
        "import sys, mhsafeeval, mhsafeeval.messages, mhsafeeval.providers, "
        "mhsafeeval.testing, mhsafeeval.cli, mhsafeeval.distributed\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


# The subpackages' surfaces: each exports what code outside it uses (another module of src,
# examples/, benchmarks/) or what README.md and docs/architecture.md name, and nothing else;
# everything else stays in its private module, where the package's own code and the tests
# import it from.
ROOT = SRC.parents[1]
PACKAGES = [
    "agents",
    "distributed",
    "framework",
    "framework.engine",
    "framework.store",
    "judges",
    "providers",
    "search",
    "storage",
    "testing",
]
USERS = [*sorted(SRC.rglob("*.py")), *sorted((ROOT / "examples").rglob("*.py"))]
USERS += sorted((ROOT / "benchmarks").rglob("*.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Plugin contracts that only third-party plugins use, so nothing here imports them; each is
# named in its package's docstring or in the docstring of a contract the package exports.
CONTRACTS = {
    "judges": {"judge"},
    "providers": {"TransientProviderError", "PermanentProviderError"},
}
# Imports of a package's private module from outside it, each to be mended where it is written
# (the name it wants is exported, or will be): (importing file, private module). The test
# fails when one is added and when one of these is gone, so the list only shrinks.
KNOWN_PRIVATE_IMPORTS = {
    ("src/mhsafeeval/_terminal.py", "mhsafeeval.framework._text"),
    ("src/mhsafeeval/budget.py", "mhsafeeval.providers._wrapper"),
    ("src/mhsafeeval/calibrate.py", "mhsafeeval.framework._resource"),
    ("src/mhsafeeval/costs.py", "mhsafeeval.providers._litellm"),
    ("src/mhsafeeval/progress.py", "mhsafeeval.framework._text"),
    ("src/mhsafeeval/testing/_demo.py", "mhsafeeval.providers._demo"),
    ("src/mhsafeeval/testing/_demo.py", "mhsafeeval.providers._scripted"),
    ("benchmarks/demo.py", "mhsafeeval.agents._echo"),
    ("benchmarks/local_model.py", "mhsafeeval.providers._local"),
    ("benchmarks/local_model.py", "mhsafeeval.providers._llama_load"),
    ("benchmarks/extra_buffers.py", "mhsafeeval.providers._llama_load"),
    ("benchmarks/extra_buffers.py", "mhsafeeval.providers._local"),
}


def _module_name(path: Path) -> str:
    """``mhsafeeval.storage._log`` for a file of src, ``examples.custom_graph`` for others."""
    parts = path.relative_to(SRC.parent if path.is_relative_to(SRC) else ROOT).with_suffix("")
    return ".".join(p for p in parts.parts if p != "__init__")


def _inside(module: str, package: str) -> bool:
    full = f"mhsafeeval.{package}"
    return module == full or module.startswith(full + ".")


def _uses(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every name ``path`` takes from a mhsafeeval module: imported
    (``from M import name``) or read as an attribute (``M.name``, ``alias.name``); a module
    itself is ``(module, "")``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, str]] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, ""))
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                found.append((module, alias.name))
                aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            value: ast.expr = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                dotted = [aliases[value.id], *reversed(chain)]
                found.append((".".join(dotted[:-1]), dotted[-1]))
    return [(m, n) for m, n in found if m == "mhsafeeval" or m.startswith("mhsafeeval.")]


def _documented_names() -> set[str]:
    """Every identifier written as code (a backtick span or a fenced block) in the docs, and
    the last part of every dotted ``mhsafeeval.x.Name`` there."""
    names: set[str] = set()
    for doc in DOCS:
        text = doc.read_text()
        code = re.findall(r"```.*?```", text, re.S)
        code += re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", "", text, flags=re.S))
        for span in code:
            names.update(re.findall(r"(?<![\w.])[A-Za-z_]\w*", span))
            names.update(re.findall(r"\bmhsafeeval(?:\.\w+)*\.(\w+)", span))
    return names


def _has_doc(module: str, name: str) -> bool:
    value = getattr(importlib.import_module(module), name)
    if inspect.isclass(value):
        return bool((vars(value).get("__doc__") or "").strip())  # its own, not a base's
    if inspect.isroutine(value) or inspect.ismodule(value):
        return bool((value.__doc__ or "").strip())
    # A value (a constant, a registry): an attribute docstring under its assignment, or a
    # comment above it, where it is defined.
    for path in SRC.rglob("*.py"):
        lines = path.read_text().splitlines()
        body = ast.parse("\n".join(lines)).body
        for stmt, after in zip(body, [*body[1:], None], strict=True):
            targets = (
                stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            )
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                return isinstance(after.value.value, str)
            if stmt.lineno > 1 and lines[stmt.lineno - 2].lstrip().startswith("#"):
                return True
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists_and_is_documented(package: str) -> None:
    module = f"mhsafeeval.{package}"
    exported = importlib.import_module(module).__all__
    assert [n for n in exported if not hasattr(importlib.import_module(module), n)] == []
    assert [n for n in exported if not _has_doc(module, n)] == []


def test_every_exported_name_has_a_user_outside_its_package() -> None:
    """A package exports a name because something outside it uses it (a name taken from one of
    its private modules counts too: the next test says where to mend that), because the docs
    name it, or because it is a plugin contract: never because it is public in a module."""
    documented = _documented_names()
    used: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for path in USERS:
        here = _module_name(path)
        for module, name in _uses(path):
            for package in PACKAGES:
                if _inside(module, package) and not _inside(here, package):
                    used[package].add(name)
    unused = {}
    for package in PACKAGES:
        mod = importlib.import_module(f"mhsafeeval.{package}")
        contracts = CONTRACTS.get(package, set())
        docs = [mod.__doc__ or "", *(getattr(mod, n).__doc__ or "" for n in mod.__all__)]
        assert all(any(c in doc for doc in docs) for c in contracts), contracts
        idle = set(mod.__all__) - used[package] - documented - contracts
        if idle:
            unused[package] = sorted(idle)
    assert unused == {}, "\n".join(f"{k}: {v}" for k, v in unused.items())


def test_nothing_outside_a_package_imports_its_private_modules() -> None:
    found = set()
    for path in USERS:
        here = _module_name(path)
        for module, name in _uses(path):
            target = f"{module}.{name}" if name.startswith("_") else module
            owners = [p for p in PACKAGES if target.startswith(f"mhsafeeval.{p}.")]
            if not owners:
                continue
            package = max(owners, key=len)  # framework.engine, not framework
            first = target.removeprefix(f"mhsafeeval.{package}.").split(".")[0]
            if first.startswith("_") and not _inside(here, package):
                found.add((str(path.relative_to(ROOT)), f"mhsafeeval.{package}.{first}"))
    assert found == KNOWN_PRIVATE_IMPORTS


# Who may import whom (STYLE.md): cli/composition on top; agents, judges, search, storage are
# siblings that talk only through messages; messages and the taxonomy (shared vocabulary: the
# cells every layer names) above the providers; the framework at the bottom. The framework
# (bus, engine, stores, lifecycle messages) imports nothing of the campaign: it runs any graph.
_BASE = {"framework", "providers", "errors"}
LAYERS = {
    "framework": {"framework", "errors"},
    "providers": {"providers", "framework", "errors"},
    "messages": {"messages", *_BASE},
    "config": {"config", *_BASE},
    "errors": {"errors"},
    "taxonomy": {"taxonomy", "errors"},
    "stats": {"stats"},  # pure statistics, shared by the report, judges and calibration
    "agents": {"agents", "messages", "taxonomy", "config", *_BASE},
    "judges": {"judges", "messages", "taxonomy", "config", "stats", *_BASE},
    "search": {"search", "messages", "taxonomy", "config", *_BASE},
    "storage": {"storage", "messages", "taxonomy", "config", "stats", *_BASE},
    "testing": {"testing", "messages", "config", *_BASE},
    # The review workbench reads the campaign's fold and statistics; reports read it.
    "review": {"review", "messages", "taxonomy", "judges", "storage", "stats", "_files", *_BASE},
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
