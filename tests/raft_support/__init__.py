"""Helpers for the raft tests: test state machines, node processes."""
