"""The repository's shape, checked: DESIGN.md's import table, cluster/'s layers, no cycles, small modules.

* **Packages** (DESIGN.md "Packages"): each product package imports only the packages its row allows.
  Every import counts -- module level, inside functions, and under ``TYPE_CHECKING``.
* **cluster/'s layers**: infrastructure (config, metadata state machines, replicas, peers, metrics,
  the seams) <- services (controller, partitions, transactions, groups) <- HTTP adapters <- the node
  process and the command-line tools. A module imports its own layer or lower ones, never upward.
* **Private modules** (``_name.py``) are imported only from inside their own top-level package.
* **No import cycle** between product modules; importing ``a.b.c`` also runs ``a.b``'s ``__init__``,
  so that edge counts too.
* **No module over 800 lines**, and benchmarks live in ``bench/``, beside the server packages.
* **The repository speaks in the present**: no tracked text narrates the project's history.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("storage", "raft", "coordinator", "cluster", "clients", "spark_io", "pyspark_txbroker", "verify")
OURS = (*PRODUCT, "bench", "tests", "ops")
MAX_LINES = 800

#: package -> what it may import of ours (a package name allows all of it; a dotted name one module).
ALLOWED: dict[str, set[str]] = {
    "storage": {"storage", "clients.protocol", "raft.state_machine"},
    "raft": {"raft"},
    "coordinator": {"coordinator", "storage", "raft", "clients.protocol"},
    "cluster": {"cluster", "storage", "raft", "coordinator", "clients"},
    "clients": {"clients"},
    "spark_io": {"spark_io", "clients"},
    "pyspark_txbroker": {"pyspark_txbroker", "spark_io"},
    "verify": {"verify", "clients", "cluster"},
}

#: cluster/'s layers, lowest first: (layer name, module name patterns relative to ``cluster.``).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("infrastructure", ("background", "config", "topics", "controller", "controller_view", "membership",
                        "cluster_nodes", "replicas", "internal_groups", "peers", "state_versions",
                        "metrics", "sequencer", "producer_ids", "seams", "prometheus_config", "deadline",
                        "readiness", "security", "security.*", "security_state", "topic_admin")),
    ("services", ("controller_service", "partitions", "routed_produce", "group_service", "group_views",
                  "group_waiters", "offset_lookup", "txn", "txn.*", "operations", "reassignment", "leader_balance")),
    ("adapters", ("http", "http.*", "kafka", "kafka.*")),
    ("process", ("node", "cli", "__main__", "health", "client_commands", "copier", "client_config",
                 "security_commands", "operations_commands", "topic_commands", "group_cli")),
]  # fmt: skip


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _product_files() -> list[pathlib.Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


MODULES = {_module_name(p): p for p in _product_files()}
KNOWN = set(MODULES)


def _is_package(name: str) -> bool:
    return MODULES.get(name, pathlib.Path()).name == "__init__.py"


def _imports(name: str, path: pathlib.Path) -> list[str]:
    """Every module of ours that ``name`` imports, anywhere in the file (absolute names)."""
    return _IMPORTS.setdefault(name, list(_scan_imports(name, path)))


_IMPORTS: dict[str, list[str]] = {}


def _scan_imports(name: str, path: pathlib.Path) -> Iterator[str]:
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield sub if sub in KNOWN else module


def _allowed(target: str, rules: set[str]) -> bool:
    return any(target == r or target.startswith(r + ".") for r in rules)


def _layer_of(module: str) -> int:
    rel = module.removeprefix("cluster.")
    for i, (_name, patterns) in enumerate(LAYERS):
        for pat in patterns:
            if rel == pat or (pat.endswith(".*") and rel.startswith(pat[:-1])):
                return i
    raise AssertionError(f"{module} is in no layer of cluster/ (add it to LAYERS)")


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_each_package_imports_only_what_its_row_allows(name: str) -> None:
    rules = ALLOWED[name.split(".")[0]]
    bad = [t for t in _imports(name, MODULES[name]) if not _allowed(t, rules)]
    assert not bad, f"{name} imports {bad}; DESIGN.md allows only {sorted(rules)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("cluster.")), ids=str)
def test_cluster_modules_import_only_their_layer_or_lower(name: str) -> None:
    mine = _layer_of(name)
    for target in _imports(name, MODULES[name]):
        if target.startswith("cluster.") and target in KNOWN:
            assert _layer_of(target) <= mine, (
                f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[_layer_of(target)][0]}): upward"
            )


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_no_module_imports_another_packages_private_module(name: str) -> None:
    top = name.split(".")[0]
    for target in _imports(name, MODULES[name]):
        private = any(part.startswith("_") and part != "__init__" for part in target.split(".")[1:])
        assert not (private and target.split(".")[0] != top), f"{name} imports {target}, private to its package"


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target in _imports(name, path):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b, then a.b.c
                mod = ".".join(parts[:i])
                if mod in KNOWN and mod != name and mod not in ancestors:
                    graph[name].add(mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_product_modules() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", _product_files() + sorted((ROOT / "bench").rglob("*.py")), ids=str)
def test_no_module_over_800_lines(path: pathlib.Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it along its concerns"


def test_benchmarks_live_beside_the_server_packages() -> None:
    inside = [p.relative_to(ROOT) for pkg in PRODUCT for p in (ROOT / pkg).rglob("bench*.py")]
    assert inside == [], "benchmarks belong in bench/"
    assert (ROOT / "bench" / "__init__.py").exists()


#: Narration of the project's past: numbered rounds of work, issue numbers, dated chapters, corrections.
HISTORY = re.compile(
    r"\bsessions? \d+|\bsession-\d+|\bissues? \d+|\(issue|\bround \d+ of work|\buntil [0-9a-f]{7}\b"
    r"|\bcorrection[,:]|\bpreviously\b|\bused to (?:be|cost|take|write|send)\b|\bformerly\b",
    re.IGNORECASE,
)


def _tracked_text_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
        names = out.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.suffix in (".py", ".md") and ".venv" not in p.parts
        ]
    return [ROOT / n for n in names if (ROOT / n).exists()]


def test_no_tracked_file_narrates_history() -> None:
    me = pathlib.Path(__file__).resolve()
    found = []
    for path in _tracked_text_files():
        if path.resolve() == me:
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()[:100]}")
    assert found == [], "history belongs in git log:\n" + "\n".join(found)


def test_the_history_check_catches_narration() -> None:
    # The samples are assembled here so that this file adds no narration of its own to the repository's text.
    samples = [
        " ".join(words)
        for words in (
            ("in", "session", "14", "we", "tried"),
            ("(issue", "5)"),
            ("this", "used", "to", "cost", "3", "commands"),
            ("fixed", "until", "d2ba998"),
        )
    ]
    for text in samples:
        assert HISTORY.search(text), text
    for text in ("an issue of the producer", "the session timeout", "a round trip"):
        assert not HISTORY.search(text), text
