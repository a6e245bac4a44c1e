"""Benchmarks: tools beside the broker, not part of it (no server package imports them).

``txbroker bench [produce|fetch|failover|idle|all]`` runs ``bench.produce``;
``txbroker bench <name>`` runs ``bench.<module>``'s ``main`` for clients
(``bench.clients``), send-path (``bench.send_path``), consume, load, txn,
copier, metrics, spark, authz (``bench.authz``: one authorization
decision with 10,000 ACLs, a credential cache hit against a miss; no
cluster) and secure (``bench.secure``: the producer on a cluster with TLS,
HTTP Basic and ACLs against a plain one, side by side). Each of those also runs as ``python -m
bench.<module>`` with the same flags. The Raft and storage layers' own
benchmarks have no ``txbroker`` entry:

* ``python -m bench.raft_replication [--bare]``: replication throughput of
  one group, the raft/ layer or stock PySyncObj;
* ``python -m bench.raft_idle``: idle CPU of many groups;
* ``python -m bench.storage_apply``: ``PartitionLog.apply`` vs raw rocksdict
  puts.

Shared by the benchmarks: ``bench.harness`` (the cluster under test, common
flags), ``bench.measure`` (CPU from /proc, quantiles, bootstrap intervals)
and ``bench.produce_load`` (the raw binary produce load). BENCHMARKS.md has
the results.
"""
