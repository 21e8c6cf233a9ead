// The strategy switch and its levers (core/options.h, brisk_set_strategy): values per strategy,
// the environment's precedence, bad input, switching under load, and the README's levers table
// matching the code.
#include <brisk/brisk.h>
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/options.h"
#include "threadcache/heap.h"
#include "tests/test_util.h"

namespace {

using brisk::options::Id;
using brisk::options::Strategy;

struct RestoreStrategy {
  brisk_strategy saved = brisk_get_strategy();
  ~RestoreStrategy() { brisk_set_strategy(saved); }
};

TEST(Strategy, BalancedIsTheDefault) { EXPECT_EQ(brisk_get_strategy(), BRISK_STRATEGY_BALANCED); }

TEST(Strategy, SetAndGetEachValue) {
  RestoreStrategy restore;
  for (brisk_strategy s : {BRISK_STRATEGY_SPEED, BRISK_STRATEGY_LOW_MEMORY, BRISK_STRATEGY_BALANCED}) {
    ASSERT_EQ(brisk_set_strategy(s), 0);
    EXPECT_EQ(brisk_get_strategy(), s);
  }
}

TEST(Strategy, AnUnknownValueIsRefusedWithEinvalAndChangesNothing) {
  RestoreStrategy restore;
  ASSERT_EQ(brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY), 0);
  errno = 0;
  EXPECT_EQ(brisk_set_strategy(static_cast<brisk_strategy>(3)), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(brisk_set_strategy(static_cast<brisk_strategy>(-1)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(brisk_get_strategy(), BRISK_STRATEGY_LOW_MEMORY);
}

TEST(Strategy, LeversFollowTheStrategyInForce) {
  RestoreStrategy restore;
  brisk_set_strategy(BRISK_STRATEGY_SPEED);
  std::int64_t speed_delay = brisk::options::get(Id::kPurgeDelayMs);
  std::int64_t speed_spans = brisk::options::get(Id::kRetainedBytes);
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  std::int64_t low_delay = brisk::options::get(Id::kPurgeDelayMs);
  std::int64_t low_spans = brisk::options::get(Id::kRetainedBytes);
  EXPECT_GT(speed_delay, low_delay);
  EXPECT_GT(speed_spans, low_spans);
  EXPECT_EQ(low_delay, brisk::options::get_for(Id::kPurgeDelayMs, Strategy::kLowMemory));
}

// get() keeps each lever's value between switches (core/options.h): while one thread switches
// and two others read every lever, no lever keeps an old strategy's value once switching stops.
TEST(Strategy, LeverValuesKeptByGetFollowEverySwitch) {
  RestoreStrategy restore;
  constexpr unsigned kCount = static_cast<unsigned>(Id::kCount);
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      while (!done.load())
        for (unsigned i = 0; i < kCount; ++i) (void)brisk::options::get(static_cast<Id>(i));
    });
  }
  for (int i = 0; i < 3000 / brisk_test::kScale; ++i) {
    brisk_set_strategy(static_cast<brisk_strategy>(i % 3));
    for (unsigned k = 0; k < kCount; ++k) (void)brisk::options::get(static_cast<Id>(k));
  }
  done = true;
  for (std::thread& t : readers) t.join();
  const Strategy now = brisk::options::strategy();
  for (unsigned i = 0; i < kCount; ++i)
    EXPECT_EQ(brisk::options::get(static_cast<Id>(i)), brisk::options::get_for(static_cast<Id>(i), now)) << i;
}

// get() may answer for the old strategy a moment after the epoch moved (a resolution racing a
// switch keeps its value until it undoes it): a heap that caches a lever against the epoch
// reads it with get_for. Here that moment is made by hand: the kept value is the low-memory
// mode's while balanced is in force and the epoch has moved; the heap must take balanced's.
TEST(Strategy, AHeapRefreshingItsLeversAfterASwitchTakesTheNewStrategysValue) {
  RestoreStrategy restore;
  brisk_free(brisk_malloc(16));  // this thread has a heap
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  const auto batch = static_cast<unsigned>(Id::kRemoteBatchBytes);
  const std::int64_t low = brisk::options::get_for(Id::kRemoteBatchBytes, Strategy::kLowMemory);
  const std::int64_t balanced = brisk::options::get_for(Id::kRemoteBatchBytes, Strategy::kBalanced);
  ASSERT_NE(low, balanced);
  brisk::options::g_value[batch].store(low + 1);  // kept: the value plus one
  brisk::heap_refresh_levers_slow(brisk::t_heap);
  EXPECT_EQ(brisk::t_heap->batch_bytes, static_cast<std::size_t>(balanced));
  EXPECT_EQ(brisk::t_heap->foreign_limit,
            static_cast<std::size_t>(brisk::options::get_for(Id::kForeignCacheBytes, Strategy::kBalanced)));
  EXPECT_FALSE(brisk::t_heap->foreign_always);
  brisk::options::drop_kept_values();
}

// A fork inside a switch (or inside a resolution racing one) must not leave the child a lever
// value of the old strategy that no switch will come to drop: the child drops them all.
TEST(Strategy, AForkChildDropsTheLeverValuesKeptBeforeTheFork) {
  RestoreStrategy restore;
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  const auto delay = static_cast<unsigned>(Id::kPurgeDelayMs);
  const std::int64_t speed = brisk::options::get_for(Id::kPurgeDelayMs, Strategy::kSpeed);
  const std::int64_t balanced = brisk::options::get_for(Id::kPurgeDelayMs, Strategy::kBalanced);
  ASSERT_NE(speed, balanced);
  brisk::options::g_value[delay].store(speed + 1);  // as if the fork cut a switch short
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(brisk::options::get(Id::kPurgeDelayMs) == balanced ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child kept the speed mode's purge delay";
  brisk::options::drop_kept_values();
}

TEST(Strategy, SwitchingIsCountedSoHeapsRereadTheirLevers) {
  RestoreStrategy restore;
  std::uint32_t before = brisk::options::strategy_epoch();
  brisk_set_strategy(BRISK_STRATEGY_SPEED);
  EXPECT_NE(brisk::options::strategy_epoch(), before);
}

// BRISK_CHUNK_CACHE=5 is set for this test's process by CMake (strategy_env_test): an option
// set in the environment keeps its value under every strategy.
TEST(StrategyEnv, AnOptionSetInTheEnvironmentWinsOverEveryStrategy) {
  if (getenv("BRISK_CHUNK_CACHE") == nullptr) GTEST_SKIP() << "run by strategy_env_test";
  RestoreStrategy restore;
  for (brisk_strategy s : {BRISK_STRATEGY_SPEED, BRISK_STRATEGY_BALANCED, BRISK_STRATEGY_LOW_MEMORY}) {
    brisk_set_strategy(s);
    EXPECT_EQ(brisk::options::get(Id::kChunkCache), 5);
  }
  // ... and BRISK_STRATEGY=low-memory chose the starting strategy.
  EXPECT_EQ(restore.saved, BRISK_STRATEGY_LOW_MEMORY);
}

// Blocks allocated and freed across threads while another thread switches strategy every
// few hundred microseconds: every block keeps its contents, nothing is lost.
TEST(Strategy, SwitchingUnderCrossThreadTrafficLosesNothing) {
  RestoreStrategy restore;
  constexpr int kRounds = 400 / brisk_test::kScale;
  std::atomic<bool> done{false};
  std::thread switcher([&] {
    int i = 0;
    while (!done.load()) {
      brisk_set_strategy(static_cast<brisk_strategy>(i++ % 3));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::vector<unsigned char*>> handoff(kRounds);
  std::thread producer([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int k = 0; k < 64; ++k) {
        std::size_t n = 16 + (r * 64 + k) % 3000;
        auto* p = static_cast<unsigned char*>(brisk_malloc(n));
        ASSERT_NE(p, nullptr);
        brisk_test::Fill(p, n, n);
        handoff[r].push_back(p);
      }
    }
  });
  producer.join();
  std::thread consumer([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int k = 0; k < 64; ++k) {
        std::size_t n = 16 + (r * 64 + k) % 3000;
        unsigned char* p = handoff[r][k];
        ASSERT_EQ(brisk_test::FirstMismatch(p, n, n), SIZE_MAX);
        brisk_free(p);
      }
    }
  });
  consumer.join();
  done = true;
  switcher.join();
}

// The README's "Strategy" levers table, row by row: | `BRISK_X` | speed | balanced | low-memory | ...
// with values as numbers with an optional k/m/g suffix ("off"/"on" for 0/1).
std::int64_t ParseValue(std::string v) {
  if (v == "off") return 0;
  if (v == "on") return 1;
  std::int64_t n = std::stoll(v);
  char suffix = v.empty() ? 0 : v.back();
  if (suffix == 'k' || suffix == 'K') n <<= 10;
  if (suffix == 'm' || suffix == 'M') n <<= 20;
  if (suffix == 'g' || suffix == 'G') n <<= 30;
  return n;
}

TEST(Strategy, TheReadmeLeversTableMatchesTheCode) {
  std::ifstream readme(BRISK_README_PATH);
  ASSERT_TRUE(readme) << BRISK_README_PATH;
  const std::map<std::string, Id> ids = {
      {"BRISK_CHUNK_CACHE", Id::kChunkCache},         {"BRISK_LARGE_CACHE_BYTES", Id::kLargeCacheBytes},
      {"BRISK_LARGE_DIRTY_BYTES", Id::kLargeDirtyBytes}, {"BRISK_LARGE_DECAY_MS", Id::kLargeDecayMs},
      {"BRISK_PURGE_BYTES", Id::kPurgeBytes},
      {"BRISK_PURGE_DELAY_MS", Id::kPurgeDelayMs},    {"BRISK_RETAINED_SPANS", Id::kRetainedSpans},
      {"BRISK_RETAINED_BYTES", Id::kRetainedBytes},   {"BRISK_PURGE_REUSED", Id::kPurgeReused},
      {"BRISK_REMOTE_BATCH_BYTES", Id::kRemoteBatchBytes}, {"BRISK_BACKGROUND", Id::kBackground},
      {"BRISK_IDLE_MS", Id::kIdleMs},         {"BRISK_PURGE_ADVICE", Id::kPurgeAdvice},
      {"BRISK_PURGE_SPAN_TAILS", Id::kPurgeSpanTails},  {"BRISK_MEDIUM_MAX", Id::kMediumMax},
      {"BRISK_MEDIUM_CACHE_BYTES", Id::kMediumCacheBytes}, {"BRISK_FOREIGN_CACHE_BYTES", Id::kForeignCacheBytes},
      {"BRISK_FOREIGN_CACHE_ALWAYS", Id::kForeignCacheAlways}, {"BRISK_LARGE_STASH_BYTES", Id::kLargeStashBytes},
      {"BRISK_POPULATE", Id::kPopulate},            {"BRISK_SPAN_KEEP", Id::kSpanKeep},
      {"BRISK_KEPT_SPAN_BYTES", Id::kKeptSpanBytes},
  };
  std::string line;
  bool in_section = false;
  int rows = 0;
  while (std::getline(readme, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Strategy";
    if (!in_section || line.rfind("| `BRISK_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) {
      auto b = c.find_first_not_of(" `"), e = c.find_last_not_of(" `");
      cells.push_back(b == std::string::npos ? "" : c.substr(b, e - b + 1));
    }
    ASSERT_GE(cells.size(), 4u) << line;
    auto it = ids.find(cells[0]);
    if (it == ids.end()) continue;  // a lever of another table's kind
    for (int s = 0; s < 3; ++s)
      EXPECT_EQ(ParseValue(cells[1 + s]), brisk::options::get_for(it->second, static_cast<Strategy>(s)))
          << cells[0] << " under strategy " << s;
    ++rows;
  }
  EXPECT_EQ(rows, static_cast<int>(ids.size())) << "every lever has a row in README's Strategy section";
}

}  // namespace
