"""The main job: a local 3-node txbroker cluster, shown doing what it is for.

Starts 3 node processes on loopback, creates a topic with 3 partitions replicated
3 ways, produces with an idempotent producer and fetches over HTTP, SIGKILLs the
leader of a partition while writing and measures the failover, restarts the
killed node and watches it catch up, restarts the whole cluster and checks that
every acknowledged record is still there exactly once. In between it shows the
exactly-once features (``ops/demo_eos.py``): the Python Producer/Consumer, a
transaction committed and one aborted (read_committed vs read_uncommitted), the
transactional consume-transform-produce copier, a Spark batch read and an
exactly-once Spark write (when pyspark is installed), and the metrics; a topic of
512 partitions, each its own Raft group, led, quiescent and nearly free while idle
(``ops/demo_scale.py``); a 4th
node added, a partition moved onto it under load and the node decommissioned
again (``ops/demo_operate.py``); Kafka clients (confluent-kafka, kafka-python) on the Kafka listener, one
log read through both doors and a transactional copy loop (``ops/demo_kafka.py``); then a second, secured
cluster (``ops/demo_secure.py``: TLS, users, ACLs, a limited
user's transactional pipeline). Prints what happened and stops every process
it started.

    python ops/demo.py [--dir DIR] [--records N] [--keep]
"""

from __future__ import annotations

import argparse
import base64
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clients._http import request_json
from clients.protocol import BrokerError
from cluster.config import free_ports, make_cluster_configs, write_configs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_eos as eos
import demo_kafka
import demo_operate
import demo_scale
import demo_secure

RETRIABLE_WAIT = 0.05


class Demo:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        ports = free_ports(6)
        self.configs = make_cluster_configs(3, directory, http_ports=ports[:3], raft_ports=ports[3:])
        self.paths = write_configs(self.configs, directory)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def url(self, node: int) -> str:
        return self.configs[node - 1].url

    def start(self, node: int) -> None:
        log = open(self.dir / f"node-{node}.log", "ab")  # noqa: SIM115 - lives with the child
        self.procs[node] = subprocess.Popen(
            [sys.executable, "-m", "cluster", "node", "start", "--config", str(self.paths[node - 1])],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def live(self) -> list[int]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_ready(self, nodes: list[int], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for n in nodes:
            while True:
                try:
                    request_json("GET", self.url(n) + "/readyz", timeout=2)
                    break
                except BrokerError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"node {n} not ready; see {self.dir}/node-{n}.log") from None
                    time.sleep(0.2)

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(sig)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def partitions(self, topic: str, via: int) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = request_json("GET", f"{self.url(via)}/v1/topics/{topic}")["partitions"]
        return result

    def leader_url(self, topic: str, partition: int) -> str | None:
        for n in self.live():
            try:
                url = self.partitions(topic, n)[partition]["leader_url"]
            except BrokerError:
                continue
            if url:
                return str(url)
        return None


class Producer:
    """Idempotent: every retry resends the same (producer id, epoch, sequence)."""

    def __init__(self, demo: Demo, topic: str) -> None:
        self.demo = demo
        self.topic = topic
        init = request_json("POST", demo.url(1) + "/v1/producers/init", {"transactional_id": None})
        self.pid, self.epoch = init["producer_id"], init["producer_epoch"]
        self.seq: dict[int, int] = {}
        self.retries = 0

    def send(self, partition: int, values: list[str], timeout: float = 30) -> int:
        body = {
            "partitions": [
                {
                    "topic": self.topic,
                    "partition": partition,
                    "producer_id": self.pid,
                    "producer_epoch": self.epoch,
                    "base_sequence": self.seq.get(partition, 0),
                    "records": [{"value": base64.b64encode(v.encode()).decode()} for v in values],
                }
            ]
        }
        deadline = time.monotonic() + timeout
        while True:
            url = self.demo.leader_url(self.topic, partition)
            if url is not None:
                try:
                    res = request_json("POST", url + "/v1/produce", body, timeout=10)["partitions"][0]
                    self.seq[partition] = self.seq.get(partition, 0) + len(values)
                    return int(res["base_offset"])
                except BrokerError as exc:
                    if not exc.retriable or time.monotonic() > deadline:
                        raise
            elif time.monotonic() > deadline:
                raise SystemExit(f"no leader for {self.topic}-{partition}")
            self.retries += 1
            time.sleep(RETRIABLE_WAIT)


def read_all(demo: Demo, topic: str, partition: int, via: int) -> list[str]:
    out: list[str] = []
    offset = 0
    while True:
        res = request_json(
            "GET",
            f"{demo.url(via)}/v1/topics/{topic}/partitions/{partition}/records"
            f"?offset={offset}&max_bytes=4194304&read_replica=any",  # that node's own copy
        )
        out += [base64.b64decode(r["value"]).decode() for r in res["records"]]
        if res["next_offset"] >= res["high_watermark"] or not res["records"]:
            return out
        offset = res["next_offset"]


def say(msg: str) -> None:
    print(msg, flush=True)


def run(args: argparse.Namespace) -> int:
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="txbroker-demo-"))
    demo = Demo(directory)
    try:
        say(f"== starting a 3-node cluster in {directory}")
        for n in (1, 2, 3):
            demo.start(n)
        t0 = time.monotonic()
        demo.wait_ready([1, 2, 3])
        say(f"   ready in {time.monotonic() - t0:.1f}s: " + ", ".join(demo.url(n) for n in (1, 2, 3)))

        say("== creating topic 'orders': 3 partitions, replication factor 3")
        request_json("POST", demo.url(2) + "/v1/topics", {"name": "orders", "partitions": 3, "replication_factor": 3})
        deadline = time.monotonic() + 30
        while not all(p["leader"] for p in demo.partitions("orders", 1)):
            if time.monotonic() > deadline:
                raise SystemExit("partitions got no leaders")
            time.sleep(0.1)
        for p in demo.partitions("orders", 1):
            say(f"   partition {p['partition']}: leader node {p['leader']}, replicas {p['replicas']}")

        producer = Producer(demo, "orders")
        acked: dict[int, list[str]] = {0: [], 1: [], 2: []}
        per_batch = 100
        batches = max(3, args.records // per_batch)
        say(f"== producing {batches * per_batch} records (idempotent producer {producer.pid}, acks=all)")
        t0 = time.monotonic()
        for i in range(batches):
            part = i % 3
            values = [f"order-{i}-{j}" for j in range(per_batch)]
            producer.send(part, values)
            acked[part] += values
        dt = time.monotonic() - t0
        say(f"   {batches * per_batch} records acknowledged in {dt:.2f}s ({batches * per_batch / dt:,.0f} records/s)")

        say("== fetching them back from every replica")
        for part in range(3):
            for node in (1, 2, 3):
                deadline = time.monotonic() + 10
                while read_all(demo, "orders", part, node) != acked[part]:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"replica of orders-{part} on node {node} differs")
                    time.sleep(0.1)
            say(f"   partition {part}: {len(acked[part])} records, identical on nodes 1, 2 and 3")

        victim = int(demo.partitions("orders", 1)[0]["leader"])
        say(f"== SIGKILL node {victim} (leader of orders-0) and keep writing")
        demo.procs[victim].send_signal(signal.SIGKILL)
        demo.procs[victim].wait()
        t_kill = time.monotonic()
        values = ["after-kill-0"]
        producer.send(0, values)
        acked[0] += values
        failover = time.monotonic() - t_kill
        new_leader = demo.partitions("orders", next(iter(demo.live())))[0]["leader"]
        say(f"   first write acknowledged by new leader node {new_leader} {failover:.2f}s after the kill")
        for i in range(10):
            values = [f"during-outage-{i}-{j}" for j in range(per_batch)]
            producer.send(i % 3, values)
            acked[i % 3] += values
        say(
            f"   wrote {10 * per_batch} more records with node {victim} down "
            f"({producer.retries} retries, no duplicates)"
        )

        say(f"== restarting node {victim}")
        demo.start(victim)
        demo.wait_ready([victim])
        t0 = time.monotonic()
        for part in range(3):
            while read_all(demo, "orders", part, victim) != acked[part]:
                if time.monotonic() - t0 > 60:
                    raise SystemExit(f"node {victim} did not catch up on orders-{part}")
                time.sleep(0.1)
        say(f"   node {victim} caught up on all 3 partitions in {time.monotonic() - t0:.1f}s")

        if not args.basic:
            bootstrap = ",".join(demo.url(n) for n in (1, 2, 3))
            eos.stage_clients(bootstrap, say)
            eos.stage_transactions(bootstrap, say)
            eos.stage_pipelined_commits(bootstrap, say)
            eos.stage_copier(bootstrap, say)
            eos.stage_verify(bootstrap, say, directory)
            eos.stage_spark(bootstrap, say, directory)
            eos.stage_metrics([demo.url(n) for n in (1, 2, 3)], say, Path(__file__).resolve().parent.parent)
            demo_scale.stage_scale(demo, say)
            demo_operate.stage_operate(demo, producer, acked, read_all, say)
            demo_kafka.stage_kafka(demo, say)
            demo_secure.stage_secure(say)

        say("== stopping the whole cluster (SIGTERM) and starting it again")
        demo.stop_all()
        for n in (1, 2, 3):
            demo.start(n)
        demo.wait_ready([1, 2, 3])
        total = 0
        for part in range(3):
            for node in (1, 2, 3):
                deadline = time.monotonic() + 30
                while (got := read_all(demo, "orders", part, node)) != acked[part]:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"after restart, node {node} orders-{part}: {len(got)} != {len(acked[part])}")
                    time.sleep(0.1)
            total += len(acked[part])
        say(f"   all {total} acknowledged records present exactly once, in order, on every node")
        say("== done")
        return 0
    finally:
        demo.stop_all()
        if not args.keep and not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="cluster directory (default: a temporary one, removed afterwards)")
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--basic", action="store_true", help="only the replication part (no clients/txn/copier/Spark)")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
