#include "threadcache/remote_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace brisk {
namespace {

#ifdef BRISK_TEST_SANITIZED
constexpr int kPerProducer = 20000;
#else
constexpr int kPerProducer = 200000;
#endif

TEST(RemoteQueue, EveryBlockArrivesExactlyOnceUnderContention) {
  constexpr int kProducers = 4;
  constexpr int kBatch = 7;
  std::vector<Block> blocks(static_cast<std::size_t>(kProducers) * kPerProducer);
  std::vector<std::uint8_t> seen(blocks.size(), 0);
  RemoteQueue q;
  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < kProducers; ++t) {
    producers.emplace_back([&, t] {
      Block* base = &blocks[static_cast<std::size_t>(t) * kPerProducer];
      for (int i = 0; i < kPerProducer; i += kBatch) {
        int n = std::min(kBatch, kPerProducer - i);
        for (int j = 0; j + 1 < n; ++j) set_link(&base[i + j], &base[i + j + 1]);
        ASSERT_TRUE(q.push(&base[i], &base[i + n - 1]));
      }
      done.fetch_add(1);
    });
  }
  std::size_t received = 0;
  auto consume = [&] {
    for (Block* b = q.take_all(); b != nullptr;) {
      auto* next = reinterpret_cast<Block*>(decoded_link(b));
      auto index = static_cast<std::size_t>(b - blocks.data());
      ASSERT_LT(index, blocks.size());
      ASSERT_EQ(seen[index], 0) << "block " << index << " arrived twice";
      seen[index] = 1;
      ++received;
      b = next;
    }
  };
  while (done.load() < kProducers) consume();
  for (auto& p : producers) p.join();
  consume();
  EXPECT_EQ(received, blocks.size());
  EXPECT_TRUE(q.empty());
}

TEST(RemoteQueue, CloseReturnsWhatWasQueuedAndRefusesMore) {
  RemoteQueue q;
  Block a{}, b{};
  ASSERT_TRUE(q.push(&a, &a));
  Block* got = q.close();
  EXPECT_EQ(got, &a);
  EXPECT_EQ(decoded_link(&a), 0u);
  EXPECT_FALSE(q.push(&b, &b));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.take_all(), nullptr);
  q.reopen();
  EXPECT_TRUE(q.push(&b, &b));
  EXPECT_EQ(q.take_all(), &b);
}

}  // namespace
}  // namespace brisk
