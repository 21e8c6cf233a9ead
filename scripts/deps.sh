#!/usr/bin/env bash
# Installs brisk's build and comparison dependencies from Debian's packages (needs root, or
# sudo). Skips apt entirely when everything is already there. apt's output goes to a log file,
# shown only if apt fails.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libtbb-dev libconcurrentqueue-dev libgtest-dev
      libbenchmark-dev libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev sqlite3 python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "deps: not root and no sudo here; as root run: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
echo "deps: installing ${missing[*]}"
log=$(mktemp "${TMPDIR:-/tmp}/brisk-deps.XXXXXX.log")
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
         --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "deps: apt-get failed (log above, also in $log)" >&2
  exit 1
fi
rm -f "$log"
