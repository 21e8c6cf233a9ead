#!/usr/bin/env bash
# Every BRISK_* variable is read when libbrisk loads, so an invalid value is reported at start-up
# (options::read_environment): before, a lever's variable was read at the lever's first use, and a
# program that never used it (true makes no large block) said nothing of a mistyped value. One
# line per invalid variable, naming it; nothing for valid values or none.
#   options_at_load.sh LIBBRISK
set -euo pipefail
lib=$(realpath "$1")
prog=$(type -P true)
expect() {  # expect "VAR=VALUE ..." "the whole stderr, its lines in any order"
  local got
  got=$(env $1 LD_PRELOAD="$lib" "$prog" 2>&1 | sort)
  [ "$got" = "$(sort <<<"$2" | sed '/^$/d')" ] || { echo "FAIL: $1 printed [$got], expected [$2]" >&2; exit 1; }
}
expect "BRISK_LARGE_CACHE_BYTES=1q" "brisk: ignoring an invalid value of BRISK_LARGE_CACHE_BYTES"
expect "BRISK_POPULATE=17" "brisk: ignoring an invalid value of BRISK_POPULATE"  # above its maximum
expect "BRISK_PURGE_DELAY_MS=" "brisk: ignoring an invalid value of BRISK_PURGE_DELAY_MS"
expect "BRISK_STRATEGY=fast" "brisk: ignoring an invalid value of BRISK_STRATEGY"
expect "BRISK_LARGE_DECAY_MS=-1 BRISK_SPAN_KEEP=x" "brisk: ignoring an invalid value of BRISK_SPAN_KEEP
brisk: ignoring an invalid value of BRISK_LARGE_DECAY_MS"
expect "BRISK_LARGE_CACHE_BYTES=2g BRISK_STRATEGY=low-memory" ""
expect "BRISK_NOT_AN_OPTION=1" ""
echo "options_at_load: ok"
