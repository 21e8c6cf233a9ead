#!/usr/bin/env bash
# The idle-server pattern (bench/idle/idle_server.cc) under LD_PRELOAD=libbrisk.so, without any
# call to brisk: two workers allocate a working set, free each other's blocks and stay alive and
# idle. The process's resident memory must fall to under 10% of its peak in balanced mode and
# under 5% in low-memory mode; the control run, with the background thread off, must keep most
# of it: it shows what the test measures. The issue's targets (5 s and 1 s) are printed and
# measured by bench/idle/idle_table.sh; the test allows 15 s and 5 s, because on a loaded
# machine the background thread may get the CPU late (a test asserts behaviour, not timing).
#   idle_return.sh LIBBRISK IDLE_SERVER
set -euo pipefail
lib=$(realpath "$1")
server=$2
fail=0
# run NAME MAX_FRACTION AT_MS[,...] [--args "SERVER ARGS"] [VAR=VALUE...]: the fraction at the last AT_MS must be below
# MAX (or, for a negative MAX, above -MAX); the others are printed.
run() {
  local name=$1 max=$2 points=$3
  shift 3
  local at=${points##*,}
  local out
  local args=(--mib 512)
  if [ "${1:-}" = --args ]; then args=($2); shift 2; fi
  out=$(env LD_PRELOAD="$lib" "$@" "$server" "${args[@]}" --at "$points")
  local got=${out##*at_${at}ms=}
  got=${got%% *}
  if awk -v g="$got" -v m="$max" 'BEGIN { exit !(m >= 0 ? g < m : g > -m) }'; then
    echo "ok   $name: $out"
  else
    echo "FAIL $name: resident/peak $got at $at ms, wanted $( [ "${max#-}" = "$max" ] && echo "< $max" || echo "> ${max#-}"): $out"
    fail=1
  fi
}
run balanced 0.10 5000,15000
run low-memory 0.05 1000,5000 BRISK_STRATEGY=low-memory
run "control (no background thread)" -0.30 2000 BRISK_BACKGROUND=0
# Sixteen workers and a smaller working set: each idle thread's classes' current spans (purged in
# place) and its partial outgoing batches (sent by the pass) are most of what is left. Before
# both: 0.55 of the peak for good; with them 0.15 (the program's own threads and libraries).
run "16 workers, balanced" 0.35 5000,15000 --args "--mib 64 --threads 16"
exit $fail
