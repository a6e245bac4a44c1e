"""The quickstart's operations stage: grow the cluster by a node, move a partition onto it, retire it again.

``txbroker cluster add-node`` registers node 4 and writes its config; the node
starts and joins. ``txbroker partitions reassign`` moves ``orders-0`` onto it
by Raft membership changes while the demo's producer keeps writing, and the
new replica is shown holding every acknowledged record. ``txbroker cluster
decommission`` then moves everything off node 4 again and the node is stopped
with nothing under-replicated.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from clients._http import request_json
from cluster.config import load_config


def _cli(demo: Any, *args: str) -> str:
    bootstrap = ",".join(demo.url(n) for n in demo.live())
    out = subprocess.run(
        [sys.executable, "-m", "cluster", *args, "--bootstrap", bootstrap],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"txbroker {' '.join(args)} failed: {out.stdout}{out.stderr}")
    return out.stdout.strip()


def stage_operate(
    demo: Any,
    producer: Any,
    acked: dict[int, list[str]],
    read_all: Callable[..., list[str]],
    say: Callable[[str], None],
) -> None:
    say("== adding a 4th node: txbroker cluster add-node, then txbroker node start")
    for line in _cli(demo, "cluster", "add-node", "--dir", str(demo.dir)).splitlines():
        say("   " + line)
    path = demo.dir / "node-4.toml"
    demo.configs.append(load_config(path))
    demo.paths.append(path)
    demo.start(4)
    demo.wait_ready([4])
    deadline = time.monotonic() + 60
    while not request_json("GET", demo.url(1) + "/v1/nodes/4")["controller_voter"]:
        if time.monotonic() > deadline:
            raise SystemExit("node 4 got no controller vote")
        time.sleep(0.2)
    say("   node 4 is up, listed by every node and holds a controller vote")

    replicas = demo.partitions("orders", 1)[0]["replicas"]
    target = [4, *replicas[1:]]
    say(f"== moving orders-0 from nodes {replicas} to {target} while writing to it")
    say("   " + _cli(demo, "partitions", "reassign", "--topic", "orders", "--partition", "0",
                     "--replicas", ",".join(map(str, target))))  # fmt: skip
    t0 = time.monotonic()
    written = 0
    while request_json("GET", demo.url(2) + "/v1/reassignments")["reassignments"]:
        values = [f"during-move-{written}-{j}" for j in range(50)]
        producer.send(0, values)
        acked[0] += values
        written += 1
        if time.monotonic() - t0 > 120:
            raise SystemExit("the move of orders-0 did not complete")
    took = time.monotonic() - t0
    say(f"   moved in {took:.1f}s by Raft membership changes; {written * 50} records written meanwhile")
    deadline = time.monotonic() + 30
    while read_all(demo, "orders", 0, 4) != acked[0]:
        if time.monotonic() > deadline:
            raise SystemExit("node 4's replica of orders-0 differs")
        time.sleep(0.1)
    say(f"   node 4's replica holds all {len(acked[0])} records of orders-0, exactly once and in order")

    say("== decommissioning node 4: its replicas move to the other nodes, then it stops")
    t0 = time.monotonic()
    _cli(demo, "cluster", "decommission", "--node", "4", "--wait", "--timeout", "180")
    state = request_json("GET", demo.url(1) + "/v1/nodes/4")
    say(f"   node 4 is {state['state']} after {time.monotonic() - t0:.1f}s (replicas left: {state['replicas']})")
    demo.procs[4].terminate()
    demo.procs[4].wait(30)
    say(f"   orders-0 replicas now {demo.partitions('orders', 1)[0]['replicas']}; node 4 stopped")
