// Allocation and free after brisk's own key destructor has run on an exiting thread: glibc runs
// up to PTHREAD_DESTRUCTOR_ITERATIONS rounds of key destructors, and one that allocates in the
// last round has no later round to give a heap back in. Such a thread must never own a heap
// again, yet its blocks must be real, intact, and reclaimed.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace {

using brisk_test::Fill;
using brisk_test::Stats;
using brisk_test::Verify;

pthread_key_t g_key;
std::atomic<long> g_rounds{0};
std::atomic<long> g_bad{0};

// Small, medium and large blocks, each written, checked and freed, and one small block freed
// in the next round, so frees of blocks allocated after exit are covered too.
void AllocateAndFree(uintptr_t round) {
  static thread_local void* carried = nullptr;  // set and cleared inside destructor rounds only
  const size_t sizes[] = {24, 3000, 200 * 1024, 3 * 1024 * 1024};
  for (size_t size : sizes) {
    void* p = brisk_malloc(size);
    if (p == nullptr) {
      g_bad++;
      continue;
    }
    size_t checked = size < 256 * 1024 ? size : 256 * 1024;  // the large block's head: time under TSan
    Fill(p, checked, round * 7 + size);
    if (!Verify(p, checked, round * 7 + size) || brisk_usable_size(p) < size) g_bad++;
    brisk_free(p);
  }
  if (carried != nullptr) brisk_free(carried);
  carried = round < PTHREAD_DESTRUCTOR_ITERATIONS ? brisk_malloc(40) : nullptr;
}

// Re-arms itself, so it runs in every round glibc makes, the last included.
void Destructor(void* value) {
  auto round = reinterpret_cast<uintptr_t>(value);
  g_rounds++;
  AllocateAndFree(round);
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) pthread_setspecific(g_key, reinterpret_cast<void*>(round + 1));
}

void* Body(void*) {
  void* p = brisk_malloc(100);  // the thread has a heap when the destructors start
  brisk_free(p);
  pthread_setspecific(g_key, reinterpret_cast<void*>(uintptr_t{1}));
  return nullptr;
}

TEST(ThreadExit, AllocationInEveryDestructorRoundLeavesNoHeapAttached) {
  alarm(60);  // a hang is a failure
  ASSERT_EQ(pthread_key_create(&g_key, Destructor), 0);
  const int threads = 400 / brisk_test::kScale;
  brisk_stats before = Stats();
  for (int i = 0; i < threads; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, Body, nullptr), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);
  }
  brisk_stats after = Stats();
  alarm(0);
  pthread_key_delete(g_key);
  EXPECT_EQ(g_bad.load(), 0);
  // Every round ran, so allocations after brisk's destructor really happened.
  EXPECT_EQ(g_rounds.load(), long{threads} * PTHREAD_DESTRUCTOR_ITERATIONS);
  // The threads ran one at a time: each exited thread's heap went back to the pool for the next.
  EXPECT_LE(after.heaps_live, before.heaps_live);
  EXPECT_LE(after.heaps_total - before.heaps_total, 2u);
  EXPECT_LE(after.chunks_mapped, before.chunks_mapped + 2);
  EXPECT_EQ(after.large_live_blocks, before.large_live_blocks);
}

}  // namespace
