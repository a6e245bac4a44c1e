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

Imports ``storage``, ``raft`` and ``clients.protocol`` only.
"""
