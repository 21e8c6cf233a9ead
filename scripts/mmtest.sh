#!/usr/bin/env bash
# The README's first command: installs what it needs, builds brisk and runs the stress suite's
# standard workloads (the seed's MMtest) under brisk and under the system allocator, through
# the comparison driver, and prints the comparison table.
# Extra arguments go to brisk-compare (for example: --pairs 5 --alloc mimalloc).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target brisk_shared brisk-stress brisk-compare
exec ./build/bench/brisk-compare --suite mmtest --alloc brisk --alloc system "$@"
