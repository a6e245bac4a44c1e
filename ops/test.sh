#!/usr/bin/env bash
# Install what the tests need and run them: lint, types, then the whole pytest suite
# (unit, integration with real node processes, fault tests). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TXBROKER_EXTRAS="${TXBROKER_EXTRAS:-dev,spark}" source "$ROOT/ops/bootstrap.sh"
# Debian's prometheus package brings prometheus and promtool for the observability tests
# (tests/integration/test_prometheus.py, tests/unit/test_alert_rules.py); CI machines are fresh.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "== installing Debian's prometheus package"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
    echo "could not install prometheus: the tests that need it will be skipped (or fail under CI)" >&2
  fi
fi
# iproute2 and nftables for the namespaced-cluster harness (verify/netns.py, tests/fault/test_netns_harness.py:
# one network namespace per node, silent drops between them); those tests skip without root.
if ! command -v ip >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "== installing Debian's iproute2 and nftables packages"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends iproute2 nftables >/dev/null; }; then
    echo "could not install iproute2/nftables: the namespaced-cluster tests will be skipped (or fail under CI)" >&2
  fi
fi
echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy --strict storage raft clients coordinator verify
mypy cluster bench
echo "== pytest"
set +e
python -m pytest -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
