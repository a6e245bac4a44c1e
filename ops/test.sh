#!/usr/bin/env bash
# Install what the tests need and run them: lint, types, then the whole pytest suite
# (unit, integration with real node processes, fault tests). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TXBROKER_EXTRAS="${TXBROKER_EXTRAS:-dev}" source "$ROOT/ops/bootstrap.sh"
echo "== ruff"
ruff check .
echo "== mypy"
mypy --strict storage raft clients coordinator
mypy cluster
echo "== pytest"
set +e
python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
