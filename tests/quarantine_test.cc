// debug/quarantine: FIFO order, the byte budget, the ring bound, draining and visiting, the
// BRISK_DEBUG_QUARANTINE option, and concurrent pushes (nothing lost or duplicated, every
// shard within its budget; run under TSan too).
#include "debug/quarantine.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#ifdef BRISK_TEST_SANITIZED
constexpr int kScale = 4;
#else
constexpr int kScale = 1;
#endif

namespace {

using brisk::debug::Quarantine;
using brisk::debug::QuarantinedBlock;

void* Fake(std::uintptr_t n) { return reinterpret_cast<void*>(n * 16); }

// Every shard's blocks, taken out (shard by shard, oldest first in each), up to capacity.
std::size_t DrainAll(Quarantine& q, QuarantinedBlock* out, std::size_t capacity) {
  std::size_t n = 0;
  for (unsigned i = 0; i < Quarantine::kShards; ++i) n += q.drain_shard(i, out + n, capacity - n);
  return n;
}

// Each test thread gets its own Quarantine object but threads keep their shard index process-wide,
// so a single-threaded test sees one shard whose budget is budget / kShards.
constexpr std::size_t kShardBudget = 1000;
constexpr std::size_t kBudget = kShardBudget * Quarantine::kShards;

TEST(Quarantine, BlocksLeaveInTheOrderTheyCameOnceTheBudgetIsExceeded) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  EXPECT_EQ(q.shard_budget(), kShardBudget);
  QuarantinedBlock out[4];
  for (std::uintptr_t i = 1; i <= 10; ++i) ASSERT_EQ(q.push(Fake(i), 100, out, 4), 0u) << i;  // 1000 bytes: at budget
  EXPECT_EQ(q.bytes(), 1000u);
  std::vector<std::uintptr_t> left;
  for (std::uintptr_t i = 11; i <= 40; ++i) {
    const std::size_t n = q.push(Fake(i), 100, out, 4);
    ASSERT_EQ(n, 1u);
    EXPECT_EQ(out[0].bytes, 100u);
    left.push_back(reinterpret_cast<std::uintptr_t>(out[0].block) / 16);
    ASSERT_LE(q.bytes(), kShardBudget);
  }
  std::vector<std::uintptr_t> expected;
  for (std::uintptr_t i = 1; i <= 30; ++i) expected.push_back(i);
  EXPECT_EQ(left, expected);
}

TEST(Quarantine, ABigBlockPushesOutAsManyOldOnesAsItNeedsAndAHugeOneStaysAloneUntilTheNextPush) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  QuarantinedBlock out[16];
  for (std::uintptr_t i = 1; i <= 10; ++i) ASSERT_EQ(q.push(Fake(i), 100, out, 16), 0u);
  ASSERT_EQ(q.push(Fake(11), 450, out, 16), 5u);  // 1450 bytes: blocks 1..5 leave
  for (std::uintptr_t i = 0; i < 5; ++i) EXPECT_EQ(out[i].block, Fake(i + 1));
  EXPECT_EQ(q.bytes(), 950u);
  // Larger than the whole shard budget: everything older leaves, the block itself stays.
  ASSERT_EQ(q.push(Fake(12), 5000, out, 16), 6u);
  EXPECT_EQ(out[5].block, Fake(11));
  EXPECT_EQ(q.bytes(), 5000u);
  EXPECT_EQ(q.count(), 1u);
  EXPECT_EQ(q.take_excess(out, 16), 0u);
  // The next push takes it out first.
  ASSERT_EQ(q.push(Fake(13), 100, out, 16), 1u);
  EXPECT_EQ(out[0].block, Fake(12));
  EXPECT_EQ(q.bytes(), 100u);
}

// Several blocks in one push (a debug heap's batch, block.cc) queue in their order, after the
// blocks already there; those over the budget leave oldest first, but never the last one.
TEST(Quarantine, ABatchQueuesInItsOrderAndKeepsItsLastBlockWhenOverTheBudget) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  QuarantinedBlock out[16];
  for (std::uintptr_t i = 1; i <= 8; ++i) ASSERT_EQ(q.push(Fake(i), 100, out, 16), 0u);
  QuarantinedBlock batch[3] = {{Fake(9), 100}, {Fake(10), 100}, {Fake(11), 300}};
  ASSERT_EQ(q.push(batch, 3, out, 16), 3u);  // 1300 bytes: 1..3 leave
  for (std::uintptr_t i = 0; i < 3; ++i) EXPECT_EQ(out[i].block, Fake(i + 1));
  EXPECT_EQ(q.bytes(), 1000u);
  QuarantinedBlock huge[2] = {{Fake(12), 100}, {Fake(13), 5000}};
  ASSERT_EQ(q.push(huge, 2, out, 16), 9u);  // every block but the huge one, oldest first
  for (std::uintptr_t i = 0; i < 9; ++i) EXPECT_EQ(out[i].block, Fake(i + 4));
  EXPECT_EQ(q.count(), 1u);
  EXPECT_EQ(q.bytes(), 5000u);
}

TEST(Quarantine, WhatASmallEvictionBufferLeftIsTakenByTakeExcess) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  QuarantinedBlock out[16];
  for (std::uintptr_t i = 1; i <= 10; ++i) ASSERT_EQ(q.push(Fake(i), 100, out, 1), 0u);
  ASSERT_EQ(q.push(Fake(11), 500, out, 1), 1u);
  EXPECT_EQ(out[0].block, Fake(1));
  EXPECT_EQ(q.bytes(), 1400u);  // over budget until the caller takes the rest
  ASSERT_EQ(q.take_excess(out, 16), 4u);
  EXPECT_EQ(out[0].block, Fake(2));
  EXPECT_EQ(out[3].block, Fake(5));
  EXPECT_EQ(q.bytes(), 1000u);
  EXPECT_EQ(q.take_excess(out, 16), 0u);
}

TEST(Quarantine, AFullRingGivesBackItsOldestEvenUnderBudget) {
  Quarantine q;
  ASSERT_TRUE(q.init(std::size_t{1} << 40, 1));  // one page of entries, a budget never reached
  QuarantinedBlock out[2];
  const std::size_t entries = 4096 / sizeof(QuarantinedBlock);
  for (std::uintptr_t i = 1; i <= entries; ++i) ASSERT_EQ(q.push(Fake(i), 1, out, 2), 0u);
  ASSERT_EQ(q.push(Fake(entries + 1), 1, out, 2), 1u);
  EXPECT_EQ(out[0].block, Fake(1));
  EXPECT_EQ(q.count(), entries);
  // A batch (a debug heap's, block.cc) takes out one old block for each block it adds.
  QuarantinedBlock batch[2] = {{Fake(entries + 2), 1}, {Fake(entries + 3), 1}};
  ASSERT_EQ(q.push(batch, 2, out, 2), 2u);
  EXPECT_EQ(out[0].block, Fake(2));
  EXPECT_EQ(out[1].block, Fake(3));
  EXPECT_EQ(q.count(), entries);
}

TEST(Quarantine, ABudgetOfZeroHoldsNothing) {
  Quarantine q;
  ASSERT_TRUE(q.init(0, 16));
  QuarantinedBlock out[1];
  ASSERT_EQ(q.push(Fake(1), 8, out, 1), 1u);
  EXPECT_EQ(out[0].block, Fake(1));
  EXPECT_EQ(q.count(), 0u);
}

TEST(Quarantine, DrainAndForEachSeeEveryBlockOldestFirst) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  QuarantinedBlock out[16];
  for (std::uintptr_t i = 1; i <= 5; ++i) ASSERT_EQ(q.push(Fake(i), 10, out, 16), 0u);
  std::vector<void*> seen;
  q.for_each([](const QuarantinedBlock& b, void* context) { static_cast<std::vector<void*>*>(context)->push_back(b.block); },
             &seen);
  EXPECT_EQ(seen, (std::vector<void*>{Fake(1), Fake(2), Fake(3), Fake(4), Fake(5)}));
  ASSERT_EQ(DrainAll(q, out, 16), 5u);
  for (std::uintptr_t i = 0; i < 5; ++i) EXPECT_EQ(out[i].block, Fake(i + 1));
  EXPECT_EQ(q.count(), 0u);
  EXPECT_EQ(q.bytes(), 0u);
}

// take_idle takes a shard's blocks, oldest first, once it has seen no push to it between two of
// its calls at least the idle time apart (the background pass's rule for a thread that stopped
// freeing), and not before.
TEST(Quarantine, TakeIdleEmptiesAShardOnlyOncePassesTheIdleTimeApartSawNoPush) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1024));
  QuarantinedBlock out[16];
  for (std::uintptr_t i = 1; i <= 3; ++i) ASSERT_EQ(q.push(Fake(i), 10, out, 16), 0u);
  EXPECT_EQ(q.take_idle(out, 16, 5000, 1000), 0u);  // the first look
  EXPECT_EQ(q.take_idle(out, 16, 5999, 1000), 0u);  // not yet idle
  ASSERT_EQ(q.push(Fake(4), 10, out, 16), 0u);
  EXPECT_EQ(q.take_idle(out, 16, 6500, 1000), 0u);  // a push since: active at 6500
  EXPECT_EQ(q.take_idle(out, 16, 7499, 1000), 0u);
  EXPECT_EQ(q.count(), 4u);
  ASSERT_EQ(q.take_idle(out, 2, 7500, 1000), 2u);  // idle: at most capacity, oldest first
  EXPECT_EQ(out[0].block, Fake(1));
  EXPECT_EQ(out[1].block, Fake(2));
  ASSERT_EQ(q.take_idle(out, 16, 7500, 1000), 2u);
  EXPECT_EQ(out[0].block, Fake(3));
  EXPECT_EQ(out[1].block, Fake(4));
  EXPECT_EQ(q.count(), 0u);
  EXPECT_EQ(q.bytes(), 0u);
}

TEST(Quarantine, TheDefaultBudgetIsTheOption) {
  const char* set = getenv("BRISK_DEBUG_QUARANTINE");
  if (set == nullptr) {
    EXPECT_EQ(Quarantine::default_budget(), std::size_t{4} << 20);
  } else {
    EXPECT_EQ(Quarantine::default_budget(), std::size_t{3} << 20) << "ctest sets 3m";
  }
}

// A ring that fills grows, while it wraps too, and its blocks still leave oldest first: blocks
// of one byte against a budget of kShardBudget keep the ring going round at kShardBudget blocks,
// then blocks of no bytes (under any budget) fill it past its first size.
TEST(Quarantine, AFullRingGrowsAndKeepsItsOrder) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1u << 16));
  std::vector<QuarantinedBlock> out(4096);
  std::uintptr_t next = 1, next_out = 1;
  auto check_out = [&](std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i].block, Fake(next_out++));
  };
  for (; next <= 3000; ++next) check_out(q.push(Fake(next), 1, out.data(), out.size()));
  EXPECT_EQ(q.count(), kShardBudget);
  for (; next <= 6000; ++next) check_out(q.push(Fake(next), 0, out.data(), out.size()));
  EXPECT_EQ(q.count(), kShardBudget + 3000);
  const std::size_t n = DrainAll(q, out.data(), out.size());
  EXPECT_EQ(n, kShardBudget + 3000);
  check_out(n);
  EXPECT_EQ(next_out, next);
}

// A shard that holds a thousand blocks at a time keeps no more of its ring resident than those
// need, however many blocks pass through: a ring of its full size from the start (65,536
// entries, 1 MiB) had every entry that a block passed through resident, 643,072 bytes here.
TEST(Quarantine, ARingKeepsResidentOnlyWhatItsBlocksNeed) {
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget, 1u << 16));
  QuarantinedBlock out[4];
  for (std::uintptr_t i = 1; i <= 40000; ++i) q.push(Fake(i), 1, out, 4);
  EXPECT_EQ(q.count(), kShardBudget);
  EXPECT_LE(q.ring_resident_bytes(), 1024 * sizeof(QuarantinedBlock)) << "the rings of 8 shards, one used";
}

// Four threads push distinct blocks; every block comes back exactly once (evicted by a push or
// drained at the end), and no push leaves its shard over budget.
TEST(Quarantine, ConcurrentPushesLoseAndDuplicateNothing) {
  constexpr int kThreads = 4;
  const std::uintptr_t per_thread = 200000 / kScale;
  Quarantine q;
  ASSERT_TRUE(q.init(kBudget * 8, 256));
  std::vector<std::vector<QuarantinedBlock>> left(kThreads);
  std::vector<std::thread> threads;
  std::atomic<bool> over_budget{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      QuarantinedBlock out[64];
      for (std::uintptr_t i = 0; i < per_thread; ++i) {
        // The block's number encodes its thread and its order: t in the top bits.
        const std::uintptr_t id = (static_cast<std::uintptr_t>(t) << 40) | (i + 1);
        const std::size_t n = q.push(Fake(id), 16 + (i * 37) % 400, out, 64);
        left[t].insert(left[t].end(), out, out + n);
        if (q.take_excess(out, 64) != 0) over_budget = true;  // push took all the excess already
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(over_budget);
  std::vector<QuarantinedBlock> rest(Quarantine::kShards * 4096);
  rest.resize(DrainAll(q, rest.data(), rest.size()));
  // Every block that left, by the thread that pushed it.
  std::vector<std::vector<std::uintptr_t>> by_owner(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (const QuarantinedBlock& b : left[t]) {
      const std::uintptr_t id = reinterpret_cast<std::uintptr_t>(b.block) / 16;
      by_owner[id >> 40].push_back(id & ((std::uintptr_t{1} << 40) - 1));
    }
  for (const QuarantinedBlock& b : rest) {
    const std::uintptr_t id = reinterpret_cast<std::uintptr_t>(b.block) / 16;
    by_owner[id >> 40].push_back(id & ((std::uintptr_t{1} << 40) - 1));
  }
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(by_owner[t].size(), per_thread) << "thread " << t;
    std::vector<std::uintptr_t> sorted = by_owner[t];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a block left twice";
    EXPECT_EQ(sorted.front(), 1u);
    EXPECT_EQ(sorted.back(), per_thread);
  }
}

}  // namespace
