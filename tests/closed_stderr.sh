#!/usr/bin/env bash
# Debug mode's reports at exit reach the stderr a program started with, after the program has
# closed it (platform::keep_stderr): the leak report of a program that fcloses stderr lists its
# live 100-byte block on the file its stderr was; so does BRISK_STATS's table in release mode. And
# a program that neither enters debug mode nor asks for BRISK_STATS keeps no duplicate of
# descriptor 2.
#   closed_stderr.sh LIBBRISK PROGRAM      PROGRAM: override_closed_stderr
set -euo pipefail
lib=$(realpath "$1")
prog=$2
err=$(mktemp)
trap 'rm -f "$err"' EXIT
LD_PRELOAD="$lib" BRISK_DEBUG=1 BRISK_DEBUG_LEAKS=2 "$prog" >/dev/null 2>"$err"
grep -q '^closed_stderr: closing stderr$' "$err" || { echo "FAIL: the program's own line is missing" >&2; exit 1; }
if ! grep -qE '^brisk: leak: 1 block, 100 bytes .* still allocated at exit' "$err"; then
  echo "FAIL: no leak report of the 100-byte block on the stderr the program closed; it got:" >&2
  cat "$err" >&2
  exit 1
fi
leak_groups=$(grep -c '^brisk: leak' "$err")
# BRISK_STATS=1 in release mode: the table at exit, after the program's own line, with the live
# 100-byte block counted among the small ones.
LD_PRELOAD="$lib" BRISK_STATS=1 "$prog" >/dev/null 2>"$err"
grep -q '^closed_stderr: closing stderr$' "$err" || { echo "FAIL: the program's own line is missing (BRISK_STATS)" >&2; exit 1; }
if ! grep -q '^brisk statistics$' "$err" || ! grep -qE '^  small_live_blocks +[1-9]' "$err"; then
  echo "FAIL: no BRISK_STATS table with a live small block on the stderr the program closed; it got:" >&2
  cat "$err" >&2
  exit 1
fi
# Release mode takes no descriptor: ls lists its own open descriptors, the same with and without
# the library.
plain=$(ls /proc/self/fd | sort -n | tr '\n' ' ')
preloaded=$(LD_PRELOAD="$lib" ls /proc/self/fd | sort -n | tr '\n' ' ')
[ "$plain" = "$preloaded" ] || { echo "FAIL: descriptors $preloaded under brisk, $plain without" >&2; exit 1; }
# Debug mode's duplicate is there (the control for the line above).
debug=$(LD_PRELOAD="$lib" BRISK_DEBUG=1 BRISK_DEBUG_LEAKS=0 ls /proc/self/fd | sort -n | tr '\n' ' ')
[ "$debug" != "$plain" ] || { echo "FAIL: debug mode shows no duplicate of descriptor 2: $debug" >&2; exit 1; }
echo "closed_stderr: ok ($leak_groups leak groups and the statistics table on the closed stderr's file)"
