#!/usr/bin/env bash
# Runs a command several times in a row while busy loops keep every core loaded, as on a CI machine
# that something else is using; stops at the first failure and says which run it was.
#
#   scripts/under-load.sh [-n RUNS] [-l LOOPS] -- COMMAND [ARG...]
#
# RUNS defaults to 10, LOOPS (busy loops beside the command) to the number of cores. Build first,
# so that the runs measure the command and not the compiler, e.g.:
#
#   cargo test -p shepherd --test dashboard --no-run
#   scripts/under-load.sh -n 10 -- cargo test -p shepherd --test dashboard
set -euo pipefail

runs=10
loops=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    -l) loops="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: $0 [-n RUNS] [-l LOOPS] -- COMMAND [ARG...]" >&2
  exit 2
fi

pids=()
stop_loops() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap stop_loops EXIT
for _ in $(seq "$loops"); do
  ( while :; do :; done ) &
  pids+=($!)
done
echo "under-load: $loops busy loops beside $*" >&2

for run in $(seq "$runs"); do
  start=$(date +%s)
  if ! "$@"; then
    echo "under-load: run $run of $runs FAILED after $(( $(date +%s) - start )) s" >&2
    exit 1
  fi
  echo "under-load: run $run of $runs passed in $(( $(date +%s) - start )) s" >&2
done
echo "under-load: all $runs runs passed with $loops busy loops" >&2
