#!/usr/bin/env bash
# BRISK_STATS=2 prints brisk_print_stats' JSON to stderr at exit, and it parses (python3's json);
# BRISK_STATS=1 prints the table. Exits 77 (ctest SKIP_RETURN_CODE) without python3.
#   stats_at_exit.sh LIBBRISK PROGRAM      PROGRAM: override_stats, run with --idle
set -euo pipefail
lib=$(realpath "$1")
prog=$2
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }
json=$(BRISK_STATS=2 LD_PRELOAD="$lib" "$prog" --idle 2>&1 >/dev/null)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
s = d["stats"]
assert s["bytes_in_use"] >= 1000, s
assert s["bytes_mapped"] == s["chunk_bytes_mapped"] + s["large_bytes_mapped"], s
assert d["thread_count"] >= 1 and len(d["threads"]) == d["thread_count"], d
assert any(c["live_blocks"] >= 1 and c["block_size"] >= 1000 for c in d["classes"]), d["classes"]
print("stats_at_exit: the JSON parses:", len(s), "fields,", len(d["classes"]), "classes")
' "$json"
table=$(BRISK_STATS=1 LD_PRELOAD="$lib" "$prog" --idle 2>&1 >/dev/null)
grep -q '^  bytes_in_use ' <<<"$table" || { echo "FAIL: no bytes_in_use row in: $table" >&2; exit 1; }
quiet=$(LD_PRELOAD="$lib" "$prog" --idle 2>&1 >/dev/null)
[ -z "$quiet" ] || { echo "FAIL: printed without BRISK_STATS: $quiet" >&2; exit 1; }
echo "stats_at_exit: ok"
