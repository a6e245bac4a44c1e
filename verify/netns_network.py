"""The network of one namespaced run: a bridge, one namespace per node, veth pairs, fault rules.

Layout of one run (``prefix`` plus a six-hex-digit run id in every name, so parallel runs
and ``sweep()`` never confuse each other's objects; interface names stay within Linux's
15 characters)::

    root namespace: bridge <prefix><run>br, address 10.x.y.1/24 (the test and workload live here)
      |- veth <prefix><run>h<i>  <->  <prefix><run>n<i> in namespace <prefix>-<run>-<i>, 10.x.y.(10+i)/24
      ...

The /24 is chosen at run time among the 10.x.y.0/24 networks nothing on the host routes
(under a lock file, so two runs starting together never pick the same one). Loopback is
up in every namespace.

Faults are silent: a cut between nodes a and b drops, inside both namespaces, every packet
to and from the other node's address (an nftables table ``inet <prefix>_<run>`` per
namespace; TCP sees silence, never a reset). Where ``nft`` is missing, blackhole routes to
the peer's address do the same job (a local sender then gets an error instead of silence).
Traffic between a node and the bridge address is never touched, so the root namespace
reaches every node at all times.

``Network.close()`` removes everything the run made, whatever stage ``create()`` reached;
``sweep()`` removes what a crashed run left (each run records its owner process in
``/run/txbroker-netns``). Everything here needs root. Used by ``verify.netns``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import json
import os
import random
import re
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

STATE_DIR = Path("/run/txbroker-netns")
MAX_NODES = 200
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,4}")
_FAULT_HOOKS = ("input", "output")


class NetnsError(Exception):
    """A namespace, link, route, nft table or node process could not be made or reached."""


# ---- pure parts ---------------------------------------------------------------------------


def check_prefix(prefix: str) -> str:
    """``prefix`` if it keeps every interface name within Linux's 15 characters, else ``ValueError``."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r} must be 1-5 characters of [a-z0-9], starting with a letter")
    return prefix


def choose_subnet(taken: Iterable[ipaddress.IPv4Network], rng: random.Random) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps none of ``taken`` (the host's routes and addresses)."""
    busy = [t for t in taken if t.prefixlen > 0]  # a default route overlaps everything and takes nothing
    for _ in range(500):
        candidate = ipaddress.IPv4Network(f"10.{rng.randrange(16, 255)}.{rng.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(t) for t in busy):
            return candidate
    raise NetnsError("no free 10.x.y.0/24 on this host")


def majority(answers: Sequence[int | None], nodes: int) -> int | None:
    """The answer more than half of ``nodes`` nodes gave (``None`` answers never win), else ``None``."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best, votes = counts.most_common(1)[0]
    return best if votes > nodes // 2 else None


def _run_names(prefix: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(namespace pattern, link pattern) of ``prefix``'s runs; group 1 is the run id."""
    p = re.escape(prefix)
    return re.compile(rf"{p}-([0-9a-f]{{6}})-\d+"), re.compile(rf"{p}([0-9a-f]{{6}})(?:br|h\d+|n\d+)")


# ---- commands ------------------------------------------------------------------------------


def run_command(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30.0) -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit status {done.returncode}'}")
    return done.stdout


def _ip(*args: str, stdin: str | None = None) -> str:
    return run_command(["ip", *args], stdin=stdin)


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(NetnsError):
        action()


def _namespaces() -> list[str]:
    try:
        out = _ip("netns", "list")
    except NetnsError:
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    try:
        return [str(link["ifname"]) for link in json.loads(_ip("-j", "link", "show") or "[]")]
    except (NetnsError, ValueError, KeyError, TypeError):
        return []


def _routed_networks() -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for entry in json.loads(_ip("-4", "-j", "route", "show", "table", "all") or "[]"):
        dst = str(entry.get("dst", "default"))
        if dst != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(_ip("-4", "-j", "addr", "show") or "[]"):
        for a in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


def _kill_namespace_processes(namespace: str) -> None:
    try:
        pids = [int(p) for p in _ip("netns", "pids", namespace).split()]
    except (NetnsError, ValueError):
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (tells a live owner from a reused pid), ``None`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- the network ---------------------------------------------------------------------------


class Network:
    """The namespaces, veth pairs, bridge and fault rules of one run (no processes).

    Node ids are 1..nodes. ``create()`` builds everything; ``close()`` removes everything
    that was made, whatever stage ``create()`` reached, and may be called any number of times.
    """

    def __init__(self, nodes: int, prefix: str = "txb", run: str | None = None, backend: str | None = None) -> None:
        """``backend``: ``"nft"``, ``"blackhole"`` or ``None`` (nft where it works, else blackhole routes)."""
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be between 1 and {MAX_NODES}")
        if backend not in (None, "nft", "blackhole"):
            raise ValueError(f"unknown fault backend {backend!r}")
        self._wanted_backend = backend
        self.prefix = check_prefix(prefix)
        self.run = run or secrets.token_hex(3)
        self.nodes = nodes
        self.bridge = f"{prefix}{self.run}br"
        self.table = f"{prefix}_{self.run}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.backend = ""  # "nft" or "blackhole", known once created
        self._state = STATE_DIR / f"{prefix}-{self.run}.json"
        self._owns_state = False
        self._made_links: list[str] = []  # deleted in reverse order by close()
        self._made_namespaces: list[str] = []
        self._cuts: set[tuple[int, int]] = set()
        self._applied: dict[int, frozenset[int]] = {}  # node -> peers its namespace drops now

    # names and addresses
    def namespace(self, node_id: int) -> str:
        return f"{self.prefix}-{self.run}-{node_id}"

    def host_veth(self, node_id: int) -> str:
        return f"{self.prefix}{self.run}h{node_id}"

    def node_veth(self, node_id: int) -> str:
        return f"{self.prefix}{self.run}n{node_id}"

    def address(self, node_id: int) -> str:
        if self.subnet is None:
            raise NetnsError("the network is not created")
        return str(self.subnet.network_address + 10 + node_id)

    @property
    def gateway(self) -> str:
        """The bridge's address: where the root namespace's traffic to the nodes comes from."""
        if self.subnet is None:
            raise NetnsError("the network is not created")
        return str(self.subnet.network_address + 1)

    def exec_argv(self, node_id: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(node_id), *argv]

    # life cycle
    def create(self) -> None:
        """Build the bridge, the namespaces and their links; every object is recorded as soon as it exists."""
        if self.subnet is not None or self._made_links or self._made_namespaces:
            raise NetnsError("the network is already created")
        STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            with open(self._state, "x") as f:  # claims the run id: no two live runs share one
                json.dump({"pid": os.getpid(), "start": _process_start(os.getpid())}, f)
        except FileExistsError as exc:
            raise NetnsError(f"run id {self.run} is in use") from exc
        self._owns_state = True
        with _host_lock():  # the subnet is taken once the bridge has its address
            subnet = choose_subnet(_routed_networks(), random.Random())
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_links.append(self.bridge)
            _ip("addr", "add", f"{subnet.network_address + 1}/24", "dev", self.bridge)
            self.subnet = subnet
        _ip("link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, host, inner = self.namespace(i), self.host_veth(i), self.node_veth(i)
            _ip("netns", "add", ns)
            self._made_namespaces.append(ns)
            _ip("link", "add", host, "type", "veth", "peer", "name", inner)  # both ends or neither
            self._made_links.append(host)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        if self._wanted_backend == "nft" and not self._try_nft_table(1):
            raise NetnsError("nft cannot make a table inside a namespace here")
        nft = self._wanted_backend == "nft" or (
            self._wanted_backend is None and shutil.which("nft") is not None and self._try_nft_table(1)
        )
        self.backend = "nft" if nft else "blackhole"
        if self.backend == "nft":
            for i in range(2, self.nodes + 1):
                self._nft(i, self._table_script())

    def close(self) -> None:
        for link in reversed(self._made_links):  # a veth's deletion takes its namespace end along
            if link in _links():
                _quietly(functools.partial(_ip, "link", "del", link))
        self._made_links.clear()
        for ns in self._made_namespaces:
            _kill_namespace_processes(ns)
            if ns in _namespaces():
                _quietly(functools.partial(_ip, "netns", "del", ns))
        self._made_namespaces.clear()
        self._cuts.clear()
        self._applied.clear()
        if self._owns_state:
            with contextlib.suppress(OSError):
                self._state.unlink()
            self._owns_state = False

    # faults
    def cut(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Silently drop all traffic between each pair of nodes, both directions."""
        touched: set[int] = set()
        for a, b in pairs:
            if a == b or not (1 <= a <= self.nodes and 1 <= b <= self.nodes):
                raise ValueError(f"cannot cut {a} from {b}")
            self._cuts.add((min(a, b), max(a, b)))
            touched |= {a, b}
        self._apply(touched)

    def heal(self) -> None:
        """Remove every cut."""
        touched = {n for n, peers in self._applied.items() if peers}
        self._cuts.clear()
        self._apply(touched)

    @property
    def cuts(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._cuts)

    def _apply(self, nodes: Iterable[int]) -> None:
        for n in sorted(nodes):
            want = frozenset(b if a == n else a for a, b in self._cuts if n in (a, b))
            have = self._applied.get(n, frozenset())
            if want == have:
                continue
            if self.backend == "nft":
                self._nft(n, self._rules_script(want))
            else:
                for peer in sorted(want - have):
                    _ip("-n", self.namespace(n), "route", "replace", "blackhole", f"{self.address(peer)}/32")
                for peer in sorted(have - want):
                    _ip("-n", self.namespace(n), "route", "del", "blackhole", f"{self.address(peer)}/32")
            self._applied[n] = want

    def _table_script(self) -> str:
        chains = "".join(
            f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept; }}\n" for hook in _FAULT_HOOKS
        )
        return f"table inet {self.table} {{\n{chains}}}\n"

    def _rules_script(self, peers: frozenset[int]) -> str:
        # One nft transaction: the namespace drops exactly ``peers`` afterwards, never a mix.
        lines = [f"flush chain inet {self.table} {hook}" for hook in _FAULT_HOOKS]
        if peers:
            addrs = ", ".join(self.address(p) for p in sorted(peers))
            lines.append(f"add rule inet {self.table} input ip saddr {{ {addrs} }} drop")
            lines.append(f"add rule inet {self.table} output ip daddr {{ {addrs} }} drop")
        return "\n".join(lines) + "\n"

    def _nft(self, node_id: int, script: str) -> None:
        run_command(self.exec_argv(node_id, ["nft", "-f", "-"]), stdin=script)

    def _try_nft_table(self, node_id: int) -> bool:
        try:
            self._nft(node_id, self._table_script())
        except NetnsError:
            return False
        return True


def sweep(prefix: str = "txb") -> int:
    """Remove the namespaces and links of ``prefix``'s runs whose owner process is gone.

    Kills any process still inside those namespaces. Returns how many namespaces and
    links it removed. Runs whose owner still lives (another test, another benchmark) stay.
    """
    check_prefix(prefix)
    ns_pattern, link_pattern = _run_names(prefix)
    namespaces = [(m.group(1), ns) for ns in _namespaces() if (m := ns_pattern.fullmatch(ns))]
    links = [(m.group(1), link) for link in _links() if (m := link_pattern.fullmatch(link))]
    states = {p.stem.removeprefix(f"{prefix}-"): p for p in STATE_DIR.glob(f"{prefix}-*.json")}
    runs = {run for run, _ in namespaces} | {run for run, _ in links} | set(states)
    live = {run for run in runs if run in states and _owner_alive(states[run])}
    removed = 0
    for run, link in links:
        if run not in live and link in _links():
            with contextlib.suppress(NetnsError):
                _ip("link", "del", link)
                removed += 1
    for run, ns in namespaces:
        if run not in live:
            _kill_namespace_processes(ns)
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", ns)
                removed += 1
    for run, state in states.items():
        if run not in live:
            with contextlib.suppress(OSError):
                state.unlink()
    return removed


def _owner_alive(state: Path) -> bool:
    try:
        owner = json.loads(state.read_text())
        pid, start = int(owner["pid"]), owner.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return _process_start(pid) is not None and _process_start(pid) == start


# ---- availability probe --------------------------------------------------------------------

_LISTENER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(4)
s.settimeout(15)
print(s.getsockname()[1], flush=True)
for _ in range(2):
    s.accept()[0].close()
"""
_CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"


@functools.cache
def unavailable_reason() -> str | None:
    """``None`` when this host can run a ``NamespacedCluster``, else why not (tests skip with it).

    Builds a two-namespace network and checks TCP from the root namespace and from the other
    namespace reaches a listener in one of them, then removes it all (once per process).
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root (creates network namespaces, veth pairs, a bridge and nftables rules)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (apt-get install iproute2)"
    net = Network(2, run=None)
    try:
        net.create()
        return _probe_tcp(net)
    except (NetnsError, OSError) as exc:
        return f"cannot build a namespaced network here: {exc}"
    finally:
        net.close()


def _probe_tcp(net: Network) -> str | None:
    listener = subprocess.Popen(
        net.exec_argv(2, [sys.executable, "-c", _LISTENER, net.address(2)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert listener.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(listener.stdout, selectors.EVENT_READ)
            if not sel.select(timeout=15):
                return "a listener inside a network namespace did not start"
        port = listener.stdout.readline().strip()
        if not port:
            return "a listener inside a network namespace did not start"
        try:
            socket.create_connection((net.address(2), int(port)), timeout=5).close()
        except OSError as exc:
            return f"the root namespace cannot reach a namespace over the bridge: {exc}"
        try:
            run_command(net.exec_argv(1, [sys.executable, "-c", _CONNECT, net.address(2), port]), timeout=15)
        except NetnsError as exc:
            return f"namespaces on one bridge cannot reach each other (bridged traffic filtered?): {exc}"
        return None
    finally:
        listener.kill()
        listener.wait()
        if listener.stdout is not None:
            listener.stdout.close()
