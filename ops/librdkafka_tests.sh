#!/usr/bin/env bash
# librdkafka's own broker tests 0090 (idempotence) and 0103 (transactions) against a local 3-node txbroker
# cluster's Kafka listener (docs/kafka-listener.md "librdkafka's own tests"). Not part of CI: it builds
# librdkafka and its test runner (several minutes on two cores the first time; cached after).
#
#   bash ops/librdkafka_tests.sh
#
# The source is librdkafka at the version the installed confluent-kafka bundles
# (confluent_kafka.libversion()), from its release tarball; where that cannot be downloaded, from the git
# repository LIBRDKAFKA_GIT names (a clone or mirror) at that version's tag, or else at the newest release
# tag below it (the script says which). It is built under .cache/librdkafka/. The cluster runs in a temporary
# folder with librdkafka's "default" test scenario (topic auto-creation on, 4 partitions, replication factor
# 3) and is stopped and removed at the end. 0103's sub-tests run one test-runner each (SUBTESTS=...), so a
# failing one does not hide the ones after it. Logs: .cache/librdkafka/logs/.
#
# Environment: LIBRDKAFKA_VERSION (default: the bundled one), LIBRDKAFKA_GIT, TEST_KAFKA_VERSION (the Kafka
# version the tests assume the broker speaks; default 3.9.0), JOBS (make -j; default 2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=ops/bootstrap.sh
source "$ROOT/ops/bootstrap.sh"
PY="$ROOT/.venv/bin/python"
CACHE="$ROOT/.cache/librdkafka"
LOGS="$CACHE/logs"
JOBS="${JOBS:-2}"
KAFKA_VERSION_FOR_TESTS="${TEST_KAFKA_VERSION:-3.9.0}"
WANTED="${LIBRDKAFKA_VERSION:-$("$PY" -c 'import confluent_kafka; print(confluent_kafka.libversion()[0])')}"
mkdir -p "$CACHE" "$LOGS"

# ---- build dependencies ---------------------------------------------------------------------------
DEBS=(build-essential pkg-config libssl-dev zlib1g-dev libzstd-dev liblz4-dev libsasl2-dev)
missing=()
for pkg in "${DEBS[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "librdkafka's build needs: ${missing[*]}" >&2
    exit 2
  fi
fi

# ---- source ---------------------------------------------------------------------------------------
source_dir() {  # prints the folder holding librdkafka's source, fetching it once
  local v="$1" dir="$CACHE/librdkafka-$1"
  if [ -f "$dir/configure" ]; then echo "$dir"; return; fi
  local tgz="$CACHE/librdkafka-$v.tar.gz"
  if curl -fsSL --max-time 300 -o "$tgz.part" \
    "https://github.com/confluentinc/librdkafka/archive/refs/tags/v$v.tar.gz" 2>/dev/null; then
    mv "$tgz.part" "$tgz"
    mkdir -p "$dir" && tar xzf "$tgz" -C "$dir" --strip-components=1
    echo "$dir"; return
  fi
  rm -f "$tgz.part"
  if [ -z "${LIBRDKAFKA_GIT:-}" ]; then
    echo "cannot download librdkafka v$v; set LIBRDKAFKA_GIT to a clone or mirror of its repository" >&2
    return 1
  fi
  local tag="v$v"
  if ! git -C "$LIBRDKAFKA_GIT" rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
    tag=""
    for t in $(git -C "$LIBRDKAFKA_GIT" tag -l 'v[0-9]*' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V); do
      if [ "$(printf '%s\n%s\n' "${t#v}" "$v" | sort -V | tail -1)" = "$v" ]; then tag="$t"; fi
    done
    [ -n "$tag" ] || { echo "no release tag at or below v$v in $LIBRDKAFKA_GIT" >&2; return 1; }
    echo "v$v is not in $LIBRDKAFKA_GIT: using $tag, the newest release below it" >&2
  fi
  dir="$CACHE/librdkafka-${tag#v}"
  if [ ! -f "$dir/configure" ]; then
    mkdir -p "$dir"
    git -C "$LIBRDKAFKA_GIT" archive --format=tar "$tag" | tar x -C "$dir"
  fi
  echo "$dir"
}
SRC="$(source_dir "$WANTED")"
USED="$(basename "$SRC")"
echo "confluent-kafka bundles librdkafka $WANTED; testing ${USED#librdkafka-} ($SRC)"

# ---- build ----------------------------------------------------------------------------------------
if [ ! -x "$SRC/tests/test-runner" ]; then
  echo "building librdkafka and its test runner (make -j$JOBS; logs in $LOGS/build.log)"
  (
    cd "$SRC"
    [ -f Makefile.config ] || ./configure --disable-curl
    make -j"$JOBS" libs
    make -j"$JOBS" -C tests test-runner
  ) >"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log" >&2; exit 1; }
fi

# ---- cluster --------------------------------------------------------------------------------------
RUN="$(mktemp -d "${TMPDIR:-/tmp}/txbroker-librdkafka.XXXXXX")"
UP_PID=""
cleanup() {
  if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
    kill -TERM "$UP_PID"
    wait "$UP_PID" 2>/dev/null || true
  fi
  rm -rf "$RUN"
}
trap cleanup EXIT

BASE="$("$PY" - <<'EOF'
import random, socket
for _ in range(200):
    base = random.randrange(20000, 40000)
    socks = []
    try:
        for port in range(base, base + 9):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break
EOF
)"
txbroker cluster init --nodes 3 --dir "$RUN" --base-port "$BASE" >/dev/null
for f in "$RUN"/node-*.toml; do
  # librdkafka's "default" test scenario (tests/scenarios/default.json)
  { printf 'auto_create_topics_enable = true\ndefault_partitions = 4\ndefault_replication_factor = 3\n'; cat "$f"; } >"$f.new"
  mv "$f.new" "$f"
done
txbroker cluster up --dir "$RUN" --timeout 120 >"$RUN/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 240); do
  grep -q '^kafka bootstrap servers:' "$RUN/up.log" && break
  kill -0 "$UP_PID" 2>/dev/null || { cat "$RUN/up.log" >&2; exit 1; }
  sleep 0.5
done
BOOTSTRAP="$(sed -n 's/^kafka bootstrap servers: //p' "$RUN/up.log")"
[ -n "$BOOTSTRAP" ] || { echo "the cluster did not start" >&2; cat "$RUN/up.log" >&2; exit 1; }
echo "cluster up: $BOOTSTRAP"

# ---- tests ----------------------------------------------------------------------------------------
cd "$SRC/tests"
cat >test.conf <<EOF
bootstrap.servers=$BOOTSTRAP
test.topic.random=true
EOF
export LD_LIBRARY_PATH="../src:../src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_KAFKA_VERSION="$KAFKA_VERSION_FOR_TESTS"
passed=0
failed=0
skipped=0
RESULTS=()

run() {  # run <log name> <test-runner flags> [SUBTESTS]: one test-runner; records its sub-tests' outcomes
  local name="$1" flags="$2" sub="${3:-}" log="$LOGS/$1.log" rc=0
  SUBTESTS="$sub" timeout 900 ./test-runner -p1 "$flags" >"$log" 2>&1 || rc=$?
  local clean
  clean="$(sed 's/\x1b\[[0-9;]*[mK]//g; s/\x1b(B//g' "$log")"
  local found=0 line
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    found=1
    RESULTS+=("PASS  ${name%%-*}  $line"); passed=$((passed + 1))
  done < <(grep -oE '\[ [^]]+: PASS \([0-9.]+s\) \]|\[ Test [^]]+ : PASS \]' <<<"$clean" |
    sed -E 's/^\[ //; s/ \]$//; s/: PASS (\([0-9.]+s\))$/ \1/; s/ : PASS$//')
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    found=1
    RESULTS+=("SKIP  ${name%%-*}  $line"); skipped=$((skipped + 1))
  done < <(grep -oE '\[ [^]]+: SKIP: [^]]+ \]' <<<"$clean" | sed -E 's/^\[ //; s/ \]$//')
  if [ "$rc" != 0 ]; then
    local why
    why="$(grep -A1 -m1 -E '^### Test .* failed at' <<<"$clean" | tr '\n' ' ' |
      sed -E 's/^### Test "[^(]*\(//; s/\)" failed at / -- failed at /; s/ at [A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9:]+: (### )?/ -- /' || true)"
    RESULTS+=("FAIL  ${name%%-*}  ${why:-$name exited with $rc} (log: $log)"); failed=$((failed + 1))
  elif [ "$found" = 0 ]; then
    RESULTS+=("FAIL  $name reported no result (see $log)"); failed=$((failed + 1))
  fi
}

echo "running 0090 (idempotence)"
TESTS=0090 run 0090 -L
echo "running 0103 (transactions, local)"
TESTS=0103 run 0103-local -l
mapfile -t SUBS < <(awk '/^int main_0103_transactions\(/,/^}/' 0103-transactions.c |
  grep -oE 'do_test_[a-z0-9_]+' | awk '!seen[$0]++')
for sub in "${SUBS[@]}"; do
  echo "running 0103 $sub"
  TESTS=0103 run "0103-$sub" -L "$sub"
done

echo
echo "librdkafka ${USED#librdkafka-} tests 0090 and 0103 against txbroker (TEST_KAFKA_VERSION=$TEST_KAFKA_VERSION):"
printf '  %s\n' "${RESULTS[@]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
