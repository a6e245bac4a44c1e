"""Cost of one authorization decision with many ACLs in place, and of an HTTP Basic credential check.

``txbroker bench authz [--acls N] [--principals N] [--decisions N] [--misses N] [--hits N] [--iterations N]``
(also ``python -m bench.authz``) builds an ``Authorizer`` over N ACLs (default
10,000): literal topic names, prefixed ones of several lengths, literal ``*``
wildcards, and group / transactional-id / cluster ACLs, for several principals
and ``User:*``, with DENYs among them. It then times ``authorize`` on a mix of
decisions -- names with a literal ACL, names under a prefix, names no ACL
mentions, principals with and without rights, DESCRIBE through an implied
operation -- and prints the mean and p99 in µs (the target: 20 µs), plus
``authorize_any``. Then the ``CredentialChecker``: a cache miss (PBKDF2 at
the given iteration count) against a hit (``cached``, answered on the event
loop). ``--json`` prints the numbers as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from bench.measure import quantile
from cluster.security.acl import CLUSTER_NAME, AclBinding, Operation, PatternType, Permission, ResourceType
from cluster.security.authorizer import Authorizer
from cluster.security.credentials import CredentialChecker
from cluster.security.scram import DEFAULT_ITERATIONS, make_credential

__all__ = ["build_acls", "credential_costs", "decision_costs", "main"]

TARGET_US = 20.0
_OPS = (Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.CREATE, Operation.DELETE, Operation.ALTER)


def build_acls(count: int, principals: int, seed: int = 1) -> list[AclBinding]:
    """``count`` ACLs: mostly topics (literal 60%, prefixed 25%), the rest groups, transactional ids, cluster."""
    rng = random.Random(seed)
    users = [f"User:user-{i}" for i in range(principals)]
    out: dict[AclBinding, None] = {}
    while len(out) < count:
        roll = rng.random()
        principal = "User:*" if rng.random() < 0.05 else rng.choice(users)
        permission = Permission.DENY if rng.random() < 0.1 else Permission.ALLOW
        op = rng.choice(_OPS)
        if roll < 0.60:
            rt, name, pattern = ResourceType.TOPIC, f"topic-{rng.randrange(count)}", PatternType.LITERAL
        elif roll < 0.85:
            team = rng.randrange(max(1, count // 20))
            name = rng.choice((f"team-{team}-", f"team-{team}-orders-", f"t{team}."))
            rt, pattern = ResourceType.TOPIC, PatternType.PREFIXED
        elif roll < 0.86:
            rt, name, pattern = ResourceType.TOPIC, "*", PatternType.LITERAL
            permission = Permission.ALLOW
            op = Operation.DESCRIBE
        elif roll < 0.93:
            rt, pattern = ResourceType.GROUP, rng.choice((PatternType.LITERAL, PatternType.PREFIXED))
            name = f"group-{rng.randrange(count)}"
        elif roll < 0.99:
            rt, pattern = ResourceType.TRANSACTIONAL_ID, rng.choice((PatternType.LITERAL, PatternType.PREFIXED))
            name = f"app-{rng.randrange(count)}"
            op = Operation.WRITE
        else:
            rt, name, pattern = ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL
            op = rng.choice((Operation.IDEMPOTENT_WRITE, Operation.CREATE, Operation.DESCRIBE))
        out[AclBinding(principal, "*", rt, name, pattern, op, permission)] = None
    return list(out)


def _queries(count: int, acls: int, principals: int, seed: int = 2) -> list[tuple[str, Operation, ResourceType, str]]:
    rng = random.Random(seed)
    users = [f"User:user-{i}" for i in range(principals)] + ["User:stranger"]
    out: list[tuple[str, Operation, ResourceType, str]] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.4:
            rt, name = ResourceType.TOPIC, f"topic-{rng.randrange(acls)}"
        elif roll < 0.7:
            team = rng.randrange(max(1, acls // 20))
            rt, name = ResourceType.TOPIC, rng.choice((f"team-{team}-orders-eu", f"t{team}.events", f"team-{team}-x"))
        elif roll < 0.8:
            rt, name = ResourceType.TOPIC, f"unmentioned-{rng.randrange(acls)}"
        elif roll < 0.9:
            rt, name = ResourceType.GROUP, f"group-{rng.randrange(acls)}"
        else:
            rt, name = ResourceType.TRANSACTIONAL_ID, f"app-{rng.randrange(acls)}"
        out.append((rng.choice(users), rng.choice(_OPS), rt, name))
    return out


def decision_costs(acls: int, principals: int, decisions: int) -> dict[str, Any]:
    """Build an Authorizer over ``acls`` ACLs and time ``decisions`` decisions (µs: mean, p50, p99, max)."""
    bindings = build_acls(acls, principals)
    started = time.perf_counter()
    authorizer = Authorizer(bindings, super_users=frozenset({"User:admin"}))
    build_s = time.perf_counter() - started
    queries = _queries(decisions, acls, principals)
    authorize = authorizer.authorize
    started = time.perf_counter()
    allowed = 0
    for principal, op, rt, name in queries:
        allowed += authorize(principal, "10.0.0.1", op, rt, name)
    mean_us = (time.perf_counter() - started) / len(queries) * 1e6
    samples: list[float] = []
    clock = time.perf_counter_ns
    for principal, op, rt, name in queries:
        t0 = clock()
        authorize(principal, "10.0.0.1", op, rt, name)
        samples.append((clock() - t0) / 1000)
    any_samples: list[float] = []
    for principal, _op, _rt, _name in queries[: max(1, len(queries) // 10)]:
        t0 = clock()
        authorizer.authorize_any(principal, "10.0.0.1", Operation.WRITE, ResourceType.TOPIC)
        any_samples.append((clock() - t0) / 1000)
    return {
        "acls": len(authorizer),
        "principals": principals,
        "decisions": len(queries),
        "allowed_fraction": round(allowed / len(queries), 3),
        "build_ms": round(build_s * 1000, 1),
        "authorize_mean_us": round(mean_us, 2),
        "authorize_p50_us": quantile(samples, 0.5, 2),
        "authorize_p99_us": quantile(samples, 0.99, 2),
        "authorize_max_us": round(max(samples), 2),
        "authorize_any_mean_us": round(statistics.fmean(any_samples), 2),
        "authorize_any_p99_us": quantile(any_samples, 0.99, 2),
    }


def credential_costs(misses: int, hits: int, iterations: int) -> dict[str, Any]:
    """Time ``check`` on a cache miss (PBKDF2) and ``cached`` / ``check`` on a hit (µs)."""
    cred = make_credential("correct horse battery staple", "SCRAM-SHA-256", iterations)
    users = {"alice": {"SCRAM-SHA-256": cred}}
    miss_samples: list[float] = []
    for _ in range(misses):
        checker = CredentialChecker(users)
        t0 = time.perf_counter()
        if not checker.check("alice", "correct horse battery staple"):
            raise RuntimeError("bench: the password did not verify")
        miss_samples.append((time.perf_counter() - t0) * 1e6)
    checker = CredentialChecker(users)
    checker.check("alice", "correct horse battery staple")
    t0 = time.perf_counter()
    for _ in range(hits):
        checker.cached("alice", "correct horse battery staple")
    hit_us = (time.perf_counter() - t0) / hits * 1e6
    t0 = time.perf_counter()
    for _ in range(hits):
        checker.check("alice", "correct horse battery staple")
    check_hit_us = (time.perf_counter() - t0) / hits * 1e6
    miss_mean = statistics.fmean(miss_samples)
    return {
        "iterations": iterations,
        "miss_mean_us": round(miss_mean, 1),
        "hit_cached_mean_us": round(hit_us, 2),
        "hit_check_mean_us": round(check_hit_us, 2),
        "miss_to_hit": round(miss_mean / hit_us, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txbroker bench authz", description=__doc__.split("\n\n")[0])
    p.add_argument("--acls", type=int, default=10_000, help="ACLs in place (default 10000)")
    p.add_argument("--principals", type=int, default=50, help="distinct user principals (default 50)")
    p.add_argument("--decisions", type=int, default=200_000, help="authorize() calls timed (default 200000)")
    p.add_argument("--misses", type=int, default=20, help="credential checks on a cache miss (default 20)")
    p.add_argument("--hits", type=int, default=100_000, help="credential checks on a cache hit (default 100000)")
    p.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, help="SCRAM iterations (default 8192)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = {
        "authorizer": decision_costs(args.acls, args.principals, args.decisions),
        "credentials": credential_costs(args.misses, args.hits, args.iterations),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    a, c = result["authorizer"], result["credentials"]
    print(f"authorizer: {a['acls']} ACLs, {a['principals']} principals, built in {a['build_ms']} ms")
    verdict = "within" if a["authorize_p99_us"] is not None and a["authorize_p99_us"] <= TARGET_US else "OVER"
    print(
        f"  authorize: mean {a['authorize_mean_us']} us, p50 {a['authorize_p50_us']} us, "
        f"p99 {a['authorize_p99_us']} us ({verdict} the {TARGET_US:g} us target), max {a['authorize_max_us']} us "
        f"over {a['decisions']} decisions ({a['allowed_fraction']:.0%} allowed)"
    )
    print(f"  authorize_any: mean {a['authorize_any_mean_us']} us, p99 {a['authorize_any_p99_us']} us")
    print(f"credentials (SCRAM-SHA-256, {c['iterations']} iterations):")
    print(f"  cache miss (PBKDF2): {c['miss_mean_us']} us")
    print(f"  cache hit: cached() {c['hit_cached_mean_us']} us, check() {c['hit_check_mean_us']} us")
    print(f"  a miss costs {c['miss_to_hit']}x a hit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
