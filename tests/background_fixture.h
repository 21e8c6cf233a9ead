// The fixture of the tests of the background thread's work and of a thread's own purge
// (background_test.cc, own_purge_test.cc): a fake clock, and passes made by the test itself.
// Both run with BRISK_BACKGROUND=0 (no thread of brisk's own), BRISK_PURGE_BYTES=1g (no purge by
// the threads themselves), BRISK_PURGE_DELAY_MS=100, BRISK_IDLE_MS=10 (a heap is idle after
// 10 ms without a slow path) and BRISK_MEDIUM_CACHE_BYTES=0 (tests/CMakeLists.txt).
#ifndef BRISK_TESTS_BACKGROUND_FIXTURE_H
#define BRISK_TESTS_BACKGROUND_FIXTURE_H

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "core/platform.h"
#include "threadcache/background.h"

namespace {

std::atomic<std::uint64_t> g_fake_now{1'000'000};
std::uint64_t FakeClock() { return g_fake_now.load(); }

class Background : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (background_test)";
    brisk::platform::set_clock_for_test(FakeClock);
  }
  void TearDown() override { brisk::platform::set_clock_for_test(nullptr); }
  // Passes as the thread would make them, the fake clock moving by step ms between them.
  static std::size_t Passes(int n, std::uint64_t step) {
    std::size_t before = brisk::background_bytes_returned();
    for (int i = 0; i < n; ++i) {
      g_fake_now += step;
      brisk::background_pass(g_fake_now.load());
    }
    return brisk::background_bytes_returned() - before;
  }
};

}  // namespace

#endif  // BRISK_TESTS_BACKGROUND_FIXTURE_H
