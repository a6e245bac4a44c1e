"""The transaction coordinator (DESIGN.md "coordinator/"): pure rules and replicated state.

Modules:

* ``states`` -- the TransactionState enum and transition table (kafka_txn.md §4.1);
* ``metadata`` -- TransactionMetadata, the persisted value per transactional id;
* ``commands`` / ``results`` -- what a ``__transaction_state-p`` Raft group replicates and answers;
* ``transitions`` -- the rules of InitProducerId, AddPartitions, EndTxn, ... as pure functions;
* ``group_commit`` -- atomic commit of a group of prepared transactions (design in its docstring);
* ``scans`` -- timeouts, expiry, abort-by-prefix, pending markers, produce-side verification;
* ``state_machine`` -- TransactionStateMachine, one partition persisted in the node's RocksDB;
* ``placement`` -- which partition owns a transactional id (Kafka's hash).

The group coordinator (``__consumer_offsets-p``): ``group_states`` (enum + table),
``group_metadata`` (replicated values), ``group_commands``, ``group_rules`` (offsets,
KIP-447 fencing, markers), ``group_assignors`` (range, roundrobin), ``group_membership``
(live joins/heartbeats/rebalances, in memory) and ``group_state_machine``.

Imports ``storage``, ``raft`` and ``clients.protocol`` only.
"""
