#!/usr/bin/env bash
# Prints, for each allocation entry point of libbrisk.so, the instructions from its first one
# to its first `ret` in address order (the fast path a call that stays on it executes), the
# calls anywhere in it (a call needs a stack frame), and the functions it tail-jumps to.
#   entry_insns.sh [--check] [path/to/libbrisk.so]
# --check (a ctest): fails unless malloc and free are exactly as long as brisk_malloc and
# brisk_free and, like them, call nothing (they leave for slow paths by tail jumps only), and
# sized operator delete is at most one instruction longer than unsized (the size is for debug
# blocks' check only: it rides in its argument register to the slow path, and GCC 12 moves it
# once to free that register for the heap, since the block-start test's rotate takes its count
# in cl; no other cost to the release path is allowed).
set -euo pipefail
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
lib=${1:-build/libbrisk.so}
raw=$(
printf '%-14s %6s %6s %s\n' entry insns calls "tail jumps to slow paths"
# By address and size from the dynamic symbol table, not by name: an entry point with a second
# name (glibc's __libc_malloc is malloc) may be labelled by either in objdump's output.
symbols=$(nm -D -S --defined-only "$lib")
for sym in malloc free _Znwm _ZdlPv _ZdlPvm calloc realloc brisk_malloc brisk_free; do
  read -r addr size < <(awk -v s="$sym" '$4 == s { print $1, $2 }' <<<"$symbols") ||
    { echo "FAIL: $lib exports no $sym" >&2; exit 1; }
  start=$((16#$addr))
  objdump -d --no-show-raw-insn --start-address="$start" --stop-address=$((start + 16#$size)) "$lib" |
  awk -v name="$sym" '
    /^[0-9a-f]+ <.*>:$/ && label == "" { label = $2; sub(/^</, "", label); sub(/>:$/, "", label) }
    /^[[:space:]]+[0-9a-f]+:/ {
      if (!done) n++
      if ($0 ~ /[[:space:]]ret/) done = 1
      if ($0 ~ /[[:space:]]call[[:space:]]/) calls++
      if ($0 ~ /[[:space:]]jmp[[:space:]]+[0-9a-f]+ </ && index($0, "<" label "+") == 0) {
        sub(/.*</, "", $0); sub(/>.*/, "", $0); exits = exits " " $0
      }
    }
    END { printf "%-14s %6d %6d %s\n", name, n, calls, exits }'
done
)
out=$(c++filt <<<"$raw")
echo "$out"
[ "$check" -eq 1 ] || exit 0
field() { awk -v s="$1" -v f="$2" '$1 == s { print $f }' <<<"$raw"; }
fail=0
for pair in malloc:brisk_malloc:0 free:brisk_free:0 _ZdlPvm:_ZdlPv:1; do
  entry=${pair%%:*} rest=${pair#*:} api=${rest%%:*} slack=${rest#*:}
  n=$(field "$entry" 2) m=$(field "$api" 2)
  if [ "$n" -lt "$m" ] || [ "$n" -gt $((m + slack)) ] || [ "$(field "$entry" 3)" != 0 ]; then
    echo "FAIL: $entry: $(field "$entry" 2) instructions and $(field "$entry" 3) calls;" \
         "$api: $(field "$api" 2) and $(field "$api" 3)" >&2
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "entry_insns: malloc and free are as short as brisk_malloc and brisk_free, sized delete within one of unsized"
exit "$fail"
