#!/usr/bin/env bash
# In secure-execution mode brisk reads no BRISK_* variable (platform::get_env): a
# set-group-ID copy of override_secure_env, run with BRISK_STRATEGY, BRISK_DEBUG,
# BRISK_DEBUG_LOG and an invalid BRISK_LARGE_CACHE_BYTES set, keeps the balanced strategy and
# release mode, creates no log file and reports nothing; the same program without the bit (the
# control) reads all four. Exits 77 (ctest SKIP_RETURN_CODE) where it cannot make a
# set-group-ID program: not root, or a file system mounted nosuid.
#   secure_env.sh PROGRAM      PROGRAM: override_secure_env
set -euo pipefail
prog=$1
# In the directory ctest runs it from (the build tree) rather than /tmp, which hardened systems
# mount nosuid.
dir=$(mktemp -d -p "$PWD" secure_env.XXXXXX)
trap 'rm -rf "$dir"' EXIT
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to make a set-group-ID program"; exit 77; }
cp "$prog" "$dir/plain"
cp "$prog" "$dir/sgid"
chgrp 65534 "$dir/sgid"
chmod g+s "$dir/sgid"
chmod 755 "$dir"
run() {  # run PROGRAM: stdout, with stderr in $dir/err
  env BRISK_STRATEGY=low-memory BRISK_DEBUG=1 BRISK_DEBUG_LEAKS=0 BRISK_DEBUG_LOG="$dir/log" \
    BRISK_LARGE_CACHE_BYTES=1q "$1" 2>"$dir/err"
}
# The control: every variable is read (strategy 2 is BRISK_STRATEGY_LOW_MEMORY).
out=$(run "$dir/plain")
[ "$out" = "secure=0 strategy=2 debug=1" ] || { echo "FAIL: without the bit: $out" >&2; exit 1; }
grep -q "ignoring an invalid value of BRISK_LARGE_CACHE_BYTES" "$dir/err" ||
  { echo "FAIL: without the bit, no report of the invalid value: $(cat "$dir/err")" >&2; exit 1; }
out=$(run "$dir/sgid")
case "$out" in
  secure=0*) echo "SKIP: the set-group-ID bit gave no secure-execution mode here (a nosuid mount?)"; exit 77 ;;
esac
[ "$out" = "secure=1 strategy=1 debug=0" ] || { echo "FAIL: in secure-execution mode: $out" >&2; exit 1; }
[ ! -s "$dir/err" ] || { echo "FAIL: in secure-execution mode it printed: $(cat "$dir/err")" >&2; exit 1; }
[ ! -e "$dir/log" ] || { echo "FAIL: in secure-execution mode it created BRISK_DEBUG_LOG's file" >&2; exit 1; }
echo "secure_env: ok (the set-group-ID copy read no BRISK_* variable)"
