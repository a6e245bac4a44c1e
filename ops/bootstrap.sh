#!/usr/bin/env bash
# Create (or reuse) the project virtualenv in .venv and install txbroker with the
# extras named in $TXBROKER_EXTRAS (default "dev"). Sourced by the other scripts.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "txbroker needs Python 3.11+ (found $("$PY" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
VENV_PY="$ROOT/.venv/bin/python"
EXTRAS="${TXBROKER_EXTRAS:-dev}"
STAMP="$ROOT/.venv/.installed-$(echo "$EXTRAS" | tr ',' '-')-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  "$VENV_PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  "$VENV_PY" -m pip install --quiet -e "$ROOT[$EXTRAS]"
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
