#!/usr/bin/env bash
# The README's second command: installs what it needs, builds brisk and runs the whole test
# suite: the release build's ctest (unit, override, glibc ports, stress smoke, bench smoke),
# then the unit and threading tests under ASan+UBSan and under TSan, both built with
# BRISK_ASSERT checked. It ends with one verdict line that adds up every stage.
# BRISK_SKIP_SANITIZERS=1 runs the release stage only.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh || exit 1
jobs=$(nproc)
passed=0 failed=0 stages=()

# run_stage NAME BUILD_DIR CTEST_ARGS... : configures, builds and runs ctest in BUILD_DIR with
# every part required (ON), so a missing dependency fails the stage instead of skipping tests.
run_stage() {
  local name=$1 dir=$2; shift 2
  local log=$dir/ctest.log
  mkdir -p "$dir"
  if ! cmake --build "$dir" -j"$jobs"; then
    stages+=("$name: build failed"); failed=$((failed + 1)); return
  fi
  (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@") 2>&1 | tee "$log"
  local line total fail
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
  if [ -z "$line" ]; then
    stages+=("$name: ctest gave no summary"); failed=$((failed + 1)); return
  fi
  fail=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line")
  passed=$((passed + total - fail)); failed=$((failed + fail))
  stages+=("$name: $((total - fail))/$total")
}

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRISK_BUILD_TESTS=ON \
  -DBRISK_BUILD_STRESS=ON -DBRISK_BUILD_BENCH=ON >/dev/null || exit 1
run_stage release build

if [ "${BRISK_SKIP_SANITIZERS:-0}" != 1 ]; then
  for san in address,undefined thread; do
    dir=build-san-${san%%,*}
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DBRISK_SANITIZE="$san" -DBRISK_CHECKED=ON \
      -DBRISK_BUILD_TESTS=ON \
      >/dev/null || exit 1
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 TSAN_OPTIONS=halt_on_error=1 \
      run_stage "$san" "$dir" -L unit
  done
fi

echo
printf "test.sh stages:"; printf " [%s]" "${stages[@]}"; echo
echo "brisk: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
