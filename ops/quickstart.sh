#!/usr/bin/env bash
# Install txbroker and run the main job: a local 3-node cluster, a topic with 3
# partitions replicated 3 ways, produce and fetch over HTTP, a leader killed with
# SIGKILL while writing, restarted and caught up, then a full restart with every
# acknowledged record still there; in between the Python clients, a committed and an
# aborted transaction, pipelined commits, the transactional copier, a Spark read and exactly-once write
# (needs Java 17), a short Jepsen-style check (txbroker verify), the metrics, a 512-partition topic whose
# idle Raft groups go quiescent (each node's idle CPU shown), a 4th node added with a
# partition moved onto it under load and the node decommissioned again, unmodified Kafka clients
# (confluent-kafka, kafka-python) producing, consuming and copying transactionally through the Kafka
# listener, and a secured cluster
# (TLS, users, ACLs via `txbroker acl add`, a limited user's transactions). Prints what happened;
# cleans up after itself.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TXBROKER_EXTRAS="${TXBROKER_EXTRAS:-dev,spark}" source "$ROOT/ops/bootstrap.sh"
exec python "$ROOT/ops/demo.py" "$@"
