#!/usr/bin/env bash
# The README's second command: installs what it needs, builds brisk and runs the whole test
# suite: the release build's ctest (unit, override, glibc ports, stress smoke, bench smoke), then the unit
# and threading tests under ASan+UBSan and under TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

if [ "${BRISK_SKIP_SANITIZERS:-0}" != 1 ]; then
  for san in address,undefined thread; do
    dir=build-san-${san%%,*}
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DBRISK_SANITIZE="$san" >/dev/null
    cmake --build "$dir" -j"$jobs"
    (cd "$dir" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j"$jobs" -L unit)
  done
fi
