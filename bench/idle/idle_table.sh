#!/bin/bash
# The idle-return table of the README's "Strategy" section: brisk-idle-server (the idle-server
# pattern) under brisk in each strategy and under every installed peer, preloaded.
#   bench/idle/idle_table.sh [build-dir] [-- idle-server args, e.g. --mib 1024 --trim]
set -u
build=${1:-build}
shift || true
[ "${1:-}" = -- ] && shift
server=$build/bench/brisk-idle-server
lib=$(readlink -f "$build/libbrisk.so")
libdir=/usr/lib/x86_64-linux-gnu
echo "| allocator | peak MiB | right after the frees | after 1 s | after 5 s |"
echo "| --- | --- | --- | --- | --- |"
row() {
  local name=$1; shift
  local out
  out=$(env "$@" "$server" --at 1000,5000 "${ARGS[@]}") || { echo "| $name | failed | | | |"; return; }
  # peak_mib=... after_free=... at_1000ms=... at_5000ms=...
  set -- $out
  echo "| $name | ${1#*=} | ${2#*=} | ${3#*=} | ${4#*=} |"
}
ARGS=("$@")
row "brisk speed" LD_PRELOAD="$lib" BRISK_STRATEGY=speed
row "brisk balanced" LD_PRELOAD="$lib"
row "brisk low-memory" LD_PRELOAD="$lib" BRISK_STRATEGY=low-memory
row "glibc" LD_PRELOAD=
for peer in jemalloc:libjemalloc.so.2 tcmalloc:libtcmalloc_minimal.so.4 mimalloc:libmimalloc.so.2 tbbmalloc:libtbbmalloc_proxy.so.2; do
  name=${peer%%:*} so=$libdir/${peer#*:}
  [ -e "$so" ] && row "$name" LD_PRELOAD="$so"
done
