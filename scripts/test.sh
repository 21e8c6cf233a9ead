#!/usr/bin/env bash
# The README's second command: installs what it needs, builds brisk and runs the whole test
# suite: the release build's ctest (unit, override, glibc ports, stress smoke, bench smoke),
# then the unit and threading tests under ASan+UBSan and under TSan, both built with
# BRISK_ASSERT checked. It ends with one verdict line that adds up every stage.
# BRISK_SKIP_SANITIZERS=1 runs the release stage only. BRISK_SOAK=1 adds the soak stage (2.5-3.5
# minutes of runs on 2 cores after its build, which would take CI past its 15 minutes, so not
# in CI): the stress suite's every workload, verified, against a library built with
# BRISK_ASSERT checked, in each strategy and in debug mode (BRISK_SOAK_SCALE, default 40;
# BRISK_SOAK_THREADS, default 16; BRISK_SOAK_SEED, default 1).
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

# run_soak DIR : the soak stage. One run of `brisk-stress all` per mode, preloading the checked
# library; a run that fails verification, aborts on an assertion or passes the timeout counts
# as failed, and its output is kept as DIR/soak-N.log. A mode's variables are split on purpose
# (`env $mode`). In debug mode a run that lists a leak fails too: brisk-stress frees every block
# it makes, and the leak report (on by default) tells what it still reaches at exit (stdio's
# buffers, the TLS of oneTBB's worker threads, which still run and are stopped for the scan)
# from what it lost.
run_soak() {
  local dir=$1 n=0 ok=0 mode
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRISK_CHECKED=ON -DBRISK_BUILD_STRESS=ON \
    >/dev/null || { stages+=("soak: configure failed"); failed=$((failed + 1)); return; }
  if ! cmake --build "$dir" -j"$jobs" --target brisk_shared brisk-stress; then
    stages+=("soak: build failed"); failed=$((failed + 1)); return
  fi
  for mode in BRISK_STRATEGY=balanced BRISK_STRATEGY=low-memory BRISK_STRATEGY=speed \
      BRISK_DEBUG=1; do
    n=$((n + 1))
    echo "soak $n: $mode"
    if env $mode LD_PRELOAD="$PWD/$dir/libbrisk.so" timeout 1800 "$dir/stress/brisk-stress" all \
        --scale "${BRISK_SOAK_SCALE:-40}" --threads "${BRISK_SOAK_THREADS:-16}" \
        --seed "${BRISK_SOAK_SEED:-1}" >"$dir/soak-$n.log" 2>&1 && ! grep -q '^brisk: leak:' "$dir/soak-$n.log"; then
      ok=$((ok + 1))
    else
      echo "soak $n failed ($mode): $dir/soak-$n.log"; tail -20 "$dir/soak-$n.log"
    fi
  done
  passed=$((passed + ok)); failed=$((failed + n - ok))
  stages+=("soak: $ok/$n")
}
if [ "${BRISK_SOAK:-0}" = 1 ]; then
  run_soak build-soak
fi

echo
printf "test.sh stages:"; printf " [%s]" "${stages[@]}"; echo
echo "brisk: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
