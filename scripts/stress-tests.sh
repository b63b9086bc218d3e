#!/usr/bin/env bash
# Run every test binary of `cargo test --release` N times, two processes at
# a time, and fail on any abnormal exit (a failed test, a signal such as
# SIGABRT from a heap check or SIGSEGV, or a hang past the time limit).
# Races at start-up and exit only show over many runs; CI runs the suite
# once, so this is run by hand (docs/reliability.md has the recorded result).
#
#   scripts/stress-tests.sh [N]        (default 200)
#
# Env: STRESS_FILTER   only binaries whose name contains this (e.g. runner)
#      STRESS_TIMEOUT  seconds one run of one binary may take (default 600)
#      STRESS_LOGS     folder for the logs of failed runs (default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."

N="${1:-200}"
FILTER="${STRESS_FILTER:-}"
LIMIT="${STRESS_TIMEOUT:-600}"
LOGS="${STRESS_LOGS:-$(mktemp -d -t mlx-backend-stress-XXXXXX)}"
mkdir -p "$LOGS"

# The test binaries, as cargo reports them (no guessing at hashed names).
mapfile -t BINARIES < <(
  cargo test --release --no-run --message-format=json 2>/dev/null |
    python3 scripts/cargo-executables.py --tests | grep -F -- "$FILTER"
)
if [[ ${#BINARIES[@]} -eq 0 ]]; then
  echo "stress-tests: no test binaries found" >&2
  exit 1
fi
# Run copies, so that a build during the run cannot swap a binary under it;
# the examples go beside them as in target/ (tests/cli_examples.rs runs them).
SNAPSHOT="$(mktemp -d -t mlx-backend-stress-bin-XXXXXX)"
trap 'rm -rf "$SNAPSHOT"' EXIT
mkdir -p "$SNAPSHOT/deps" "$SNAPSHOT/examples"
for b in "${BINARIES[@]}"; do cp "$b" "$SNAPSHOT/deps/"; done
EXAMPLES="$(dirname "${BINARIES[0]}")/../examples"
find "$EXAMPLES" -maxdepth 1 -type f -executable ! -name '*-*' -exec cp {} "$SNAPSHOT/examples/" \;
for i in "${!BINARIES[@]}"; do BINARIES[$i]="$SNAPSHOT/deps/$(basename "${BINARIES[$i]}")"; done
echo "stress-tests: ${#BINARIES[@]} binaries x $N runs, two at a time; logs of failures in $LOGS"

# One run of one binary; prints a line and keeps the log when it fails.
run_one() {
  local bin="$1" round="$2" name log rc
  name="$(basename "$bin")"
  log="$LOGS/$name.$round.log"
  set +e
  timeout --signal=KILL "$LIMIT" "$bin" -q --test-threads=2 >"$log" 2>&1
  rc=$?
  set -e
  if [[ $rc -eq 0 ]]; then
    rm -f "$log"
    return 0
  fi
  echo "FAIL: $name run $round exited $rc (log: $log)"
  tail -n 5 "$log" | sed 's/^/    /'
  return 1
}
export -f run_one
export LOGS LIMIT

start=$SECONDS
failures=0
for round in $(seq 1 "$N"); do
  # Two at a time: each binary with the next one in the list.
  for ((i = 0; i < ${#BINARIES[@]}; i += 2)); do
    pids=()
    run_one "${BINARIES[$i]}" "$round" &
    pids+=($!)
    if ((i + 1 < ${#BINARIES[@]})); then
      run_one "${BINARIES[$((i + 1))]}" "$round" &
      pids+=($!)
    fi
    for p in "${pids[@]}"; do
      wait "$p" || failures=$((failures + 1))
    done
  done
  if ((round % 10 == 0 || round == N)); then
    echo "stress-tests: round $round/$N, $failures abnormal exits, $((SECONDS - start)) s"
  fi
done
runs=$((N * ${#BINARIES[@]}))
echo "stress-tests: $runs runs of ${#BINARIES[@]} binaries, $failures abnormal exits, $((SECONDS - start)) s"
[[ $failures -eq 0 ]]
