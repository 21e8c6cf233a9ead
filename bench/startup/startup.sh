#!/usr/bin/env bash
# Start-up cost of preloading an allocator into a small C program: wall time per run of
# PROGRAM (default /bin/true) and its peak RSS, with no preload and under each library given.
# Rounds alternate the configurations; the median of the rounds is printed.
#   startup.sh [--runs N] [--rounds R] [--program P] LABEL=LIB.so...
set -euo pipefail
runs=300 rounds=7 program=/bin/true
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    *) break ;;
  esac
done
labels=(none) libs=("")
for spec in "$@"; do labels+=("${spec%%=*}"); libs+=("${spec#*=}"); done
declare -A times
run_batch() {  # run_batch LIB: microseconds per run over $runs runs
  local lib=$1 start end
  start=$(date +%s%N)
  if [ -n "$lib" ]; then
    for ((i = 0; i < runs; i++)); do LD_PRELOAD=$lib "$program"; done
  else
    for ((i = 0; i < runs; i++)); do "$program"; done
  fi
  end=$(date +%s%N)
  echo $(( (end - start) / runs / 1000 ))
}
for ((r = 0; r < rounds; r++)); do
  for i in "${!labels[@]}"; do times[$i]+="$(run_batch "${libs[$i]}") "; done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-12s %12s %14s\n' preload us_per_run peak_rss_kib
for i in "${!labels[@]}"; do
  if [ -n "${libs[$i]}" ]; then
    rss=$(LD_PRELOAD=${libs[$i]} /usr/bin/time -f %M "$program" 2>&1 >/dev/null | tail -1)
  else
    rss=$(/usr/bin/time -f %M "$program" 2>&1 >/dev/null | tail -1)
  fi
  printf '%-12s %12s %14s\n' "${labels[$i]}" "$(median "${times[$i]}")" "$rss"
done
