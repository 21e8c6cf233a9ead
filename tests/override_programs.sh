#!/usr/bin/env bash
# Runs a real program from the machine with and without LD_PRELOAD=libbrisk.so and checks that
# the outputs are identical and that the preloaded run really bound malloc to libbrisk.so.
#   override_programs.sh LIBBRISK PROGRAM [debug]     PROGRAM: python3 | sort | sqlite3
# debug: the preloaded run is in debug mode (BRISK_DEBUG=1, python3 with PYTHONMALLOC=malloc so
# that its objects are debug blocks), must report nothing and print the same output. The leak
# report is on (its default, blocks no pointer reaches): a program that leaves memory it still
# points to for exit to reclaim gets only the line that counts those blocks, never a leak.
# sort runs without it: coreutils' sort 9.1 (Debian 12) loses one 56-byte block (valgrind
# --leak-check=full calls it "definitely lost" too), which brisk reports.
# Exits 77 (ctest SKIP_RETURN_CODE) when PROGRAM is not installed.
set -euo pipefail
lib=$(realpath "$1")
prog=$2
mode=${3:-release}
[ -f "$lib" ] || { echo "no library at $lib" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/brisk-override-$prog.XXXXXX")
trap 'rm -rf "$work"' EXIT

skip() { echo "SKIP: $*"; exit 77; }

case "$prog" in
  python3)
    command -v python3 >/dev/null || skip "python3 is not installed"
    # Resolve a version-manager shim (pyenv) to the real interpreter.
    exe=$(python3 -c 'import sys; print(sys.executable)')
    cat >"$work/script.py" <<'EOF'
import hashlib, json
h = hashlib.sha256()
data = {}
for i in range(100000):
    key = "k%d" % (i * 7919 % 100003)
    data.setdefault(key, []).append(str(i) * (i % 13))
    if i % 5 == 0:
        data.pop("k%d" % (i * 31 % 100003), None)
rows = sorted((k, len(v), sum(len(s) for s in v)) for k, v in data.items())
words = [("w%x" % (i * i)) * (1 + i % 40) for i in range(30000)]
text = " ".join(words)
big = [list(range(i % 300)) for i in range(20000)]
h.update(json.dumps(rows).encode())
h.update(text.encode())
h.update(repr([sum(b) for b in big]).encode())
print(len(data), len(text), h.hexdigest())
EOF
    cmd=("$exe" "$work/script.py")
    export PYTHONHASHSEED=0
    ;;
  sort)
    command -v sort >/dev/null || skip "sort is not installed"
    awk 'BEGIN { srand(42); for (i = 0; i < 200000; i++) printf "%08d %s %d\n", int(rand() * 1e8), substr("abcdefghijklmnopqrstuvwxyz", 1 + int(rand() * 26)), i }' >"$work/input.txt"
    cmd=(sort --parallel=2 -S 32M -k2,2 -k1,1n "$work/input.txt")
    export LC_ALL=C
    ;;
  sqlite3)
    command -v sqlite3 >/dev/null || skip "sqlite3 is not installed"
    {
      echo "CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, val REAL);"
      echo "BEGIN;"
      awk 'BEGIN { for (i = 1; i <= 50000; i++) printf "INSERT INTO t(grp, name, val) VALUES (%d, %s, %d.5);\n", i % 97, "\x27name" i % 1013 "-" i "\x27", i * 37 % 10007 }'
      echo "COMMIT;"
      echo "CREATE INDEX t_name ON t(name);"
      echo "SELECT count(*), sum(val), min(name), max(name) FROM t;"
      echo "SELECT grp, count(*), round(avg(val), 3), group_concat(id % 10, '') FROM t GROUP BY grp ORDER BY grp;"
      echo "SELECT name, val FROM t WHERE name LIKE 'name7%' ORDER BY val DESC, name LIMIT 50;"
    } >"$work/script.sql"
    cmd=(sqlite3 "$work/db.sqlite")
    ;;
  *)
    echo "unknown program $prog" >&2
    exit 2
    ;;
esac

run() {  # run OUTFILE [env...]: runs the command with the given extra environment
  local out=$1
  shift
  if [ "$prog" = sqlite3 ]; then
    rm -f "$work/db.sqlite"
    env "$@" "${cmd[@]}" <"$work/script.sql" >"$out"
  else
    env "$@" "${cmd[@]}" >"$out"
  fi
}

if [ "$mode" = debug ]; then
  export PYTHONMALLOC=malloc
  run "$work/plain.out"
  leaks=1
  [ "$prog" = sort ] && leaks=0
  run "$work/brisk.out" LD_PRELOAD="$lib" BRISK_DEBUG=1 BRISK_DEBUG_LEAKS=$leaks BRISK_DEBUG_LOG="$work/debug.log"
  if ! cmp -s "$work/plain.out" "$work/brisk.out"; then
    echo "FAIL: $prog output differs in debug mode" >&2
    diff "$work/plain.out" "$work/brisk.out" | head -20 >&2
    exit 1
  fi
  [ -s "$work/plain.out" ] || { echo "FAIL: $prog printed nothing" >&2; exit 1; }
  # The line counting blocks still reachable at exit is no report of a problem.
  if [ -s "$work/debug.log" ] && grep -qv '^brisk: leaks: not listed, ' "$work/debug.log"; then
    echo "FAIL: $prog: debug mode reported:" >&2
    head -40 "$work/debug.log" >&2
    exit 1
  fi
  echo "$prog: output identical in debug mode ($(wc -l <"$work/plain.out") lines), no report"
  exit 0
fi
run "$work/plain.out"
run "$work/brisk.out" LD_PRELOAD="$lib"
if ! cmp -s "$work/plain.out" "$work/brisk.out"; then
  echo "FAIL: $prog output differs under LD_PRELOAD=$lib" >&2
  diff "$work/plain.out" "$work/brisk.out" | head -20 >&2
  exit 1
fi
[ -s "$work/plain.out" ] || { echo "FAIL: $prog printed nothing" >&2; exit 1; }

# The preloaded run must bind malloc (from the program and from libc itself) to libbrisk.so.
run /dev/null LD_PRELOAD="$lib" LD_DEBUG=bindings LD_DEBUG_OUTPUT="$work/ld"
bindings=$(cat "$work"/ld.* | grep -E "normal symbol \`(malloc|free|calloc|realloc)'" || true)
to_brisk=$(grep -c "to $lib" <<<"$bindings" || true)
# ld.so prints the path it loaded, which is the LD_PRELOAD value; match on the file name too.
to_brisk_name=$(grep -c "libbrisk.so" <<<"$bindings" || true)
to_libc=$(grep -E "to [^ ]*libc\.so" <<<"$bindings" || true)
if [ "$to_brisk_name" -eq 0 ]; then
  echo "FAIL: $prog never bound malloc/free to libbrisk.so; bindings seen:" >&2
  head -5 <<<"$bindings" >&2
  exit 1
fi
if [ -n "$to_libc" ]; then
  echo "FAIL: $prog bound allocation functions to libc under LD_PRELOAD:" >&2
  head -5 <<<"$to_libc" >&2
  exit 1
fi
echo "$prog: output identical with and without brisk ($(wc -l <"$work/plain.out") lines);" \
  "$to_brisk_name malloc/free/calloc/realloc bindings to libbrisk.so ($to_brisk by full path)"
