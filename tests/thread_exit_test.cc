// Allocation and free after brisk's own key destructor has run on an exiting thread: glibc runs
// up to PTHREAD_DESTRUCTOR_ITERATIONS rounds of key destructors, and one that allocates in the
// last round has no later round to give a heap back in. Such a thread must never own a heap
// again, yet its blocks must be real, intact, and reclaimed.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "threadcache/background.h"

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

// A thread whose first allocation comes in the last round of key destructors: its heap's key
// is set when no round is left to run brisk's destructor, so the heap stays attached after the
// thread is gone, unless a sweep finds that thread gone (heap_reap_exited). Each such thread
// leaves one small block for the test to check and free later: the block must outlive the
// reclaiming of its heap.
pthread_key_t g_late_key;
std::atomic<long> g_late_rounds{0};
void* g_late_blocks[512];
std::atomic<int> g_late_next{0};

void LateDestructor(void* value) {
  auto round = reinterpret_cast<uintptr_t>(value);
  g_late_rounds++;
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(g_late_key, reinterpret_cast<void*>(round + 1));
    return;
  }
  const int i = g_late_next++;
  void* kept = brisk_malloc(48);
  if (kept != nullptr) Fill(kept, 48, 1000 + i);
  g_late_blocks[i] = kept;
  void* p = brisk_malloc(3000);  // a medium block too, freed at once
  brisk_free(p);
}

void* LateBody(void*) {
  pthread_setspecific(g_late_key, reinterpret_cast<void*>(uintptr_t{1}));
  return nullptr;
}

// Starts and joins `threads` threads one after the other, each allocating first in the last
// destructor round.
void RunLateThreads(int threads) {
  for (int i = 0; i < threads; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, LateBody, nullptr), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);
  }
}

// Every block the late threads left is intact; then freed.
void CheckAndFreeLateBlocks() {
  const int n = g_late_next.exchange(0);
  for (int i = 0; i < n; ++i) {
    ASSERT_NE(g_late_blocks[i], nullptr);
    EXPECT_TRUE(Verify(g_late_blocks[i], 48, 1000 + i)) << "block " << i;
    brisk_free(g_late_blocks[i]);
  }
}

// Calls step() until heaps_live is back at `live` (a joined thread may still be on its way out
// of the kernel for a moment, and counts as present until then), for at most 10 s.
template <class Step>
uint64_t HeapsLiveAfter(uint64_t live, Step step) {
  uint64_t now_live = Stats().heaps_live;
  for (int i = 0; i < 1000 && now_live > live; ++i) {
    step();
    now_live = Stats().heaps_live;
    if (now_live > live) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return now_live;
}

// TSan ends a thread's own state in the last round of key destructors (its key comes before the
// test's), and an atomic operation there crashes TSan's runtime (SyncClock::Resize): not a thing
// a program under TSan can do, brisk or not.
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() GTEST_SKIP() << "code in the last destructor round crashes TSan's runtime"
#else
#define SKIP_UNDER_TSAN() static_cast<void>(0)
#endif

TEST(ThreadExit, HeapsOfThreadsFirstAllocatingInTheLastRoundAreReclaimed) {
  SKIP_UNDER_TSAN();
  alarm(120);
  ASSERT_EQ(pthread_key_create(&g_late_key, LateDestructor), 0);
  const int threads = 200 / brisk_test::kScale;
  brisk_stats before = Stats();
  RunLateThreads(threads);
  brisk_stats after = Stats();
  EXPECT_EQ(g_late_rounds.exchange(0), long{threads} * PTHREAD_DESTRUCTOR_ITERATIONS);
  // Each new thread's first allocation sweeps once the heaps made since the last sweep reach
  // the number attached (at least 8), so the gone threads' heaps are reused: not one heap per
  // thread.
  EXPECT_LE(after.heaps_total - before.heaps_total, 24u);
  EXPECT_LE(after.heaps_live, before.heaps_live + 24);
  // brisk_trim sweeps too: every one of them back.
  EXPECT_LE(HeapsLiveAfter(before.heaps_live, [] { brisk_trim(); }), before.heaps_live);
  CheckAndFreeLateBlocks();
  alarm(0);
  pthread_key_delete(g_late_key);
}

// The background pass reclaims them too, once it has seen them idle, with no call from the
// program. (Run here from the test's thread, which joined the threads: that orders the gone
// threads' last writes before the pass for ASan and any checker; the real background thread has
// only the kernel's order.)
TEST(ThreadExit, TheBackgroundPassReclaimsHeapsOfGoneThreads) {
  SKIP_UNDER_TSAN();
  alarm(120);
  ASSERT_EQ(pthread_key_create(&g_late_key, LateDestructor), 0);
  brisk_trim();  // no heap of the test before this one left
  brisk_stats before = Stats();
  RunLateThreads(4);
  EXPECT_GT(Stats().heaps_live, before.heaps_live);  // the last thread's heap at least
  // BRISK_IDLE_MS is 10 (tests/CMakeLists.txt): the clock moves 1 s a pass.
  uint64_t now = 1'000'000'000;
  EXPECT_LE(HeapsLiveAfter(before.heaps_live, [&] { brisk::background_pass(now += 1000); }), before.heaps_live);
  CheckAndFreeLateBlocks();
  alarm(0);
  pthread_key_delete(g_late_key);
}

// A thread that leaves by the exit system call runs no key destructor at all: its heap is found
// the same way.
void* RawExitBody(void*) {
  void* kept = brisk_malloc(48);
  if (kept != nullptr) Fill(kept, 48, 1000 + g_late_next.load());
  g_late_blocks[g_late_next++] = kept;
  syscall(SYS_exit, 0);
  return nullptr;
}

TEST(ThreadExit, AThreadLeavingByTheExitSystemCallHasItsHeapReclaimed) {
#ifdef BRISK_TEST_SANITIZED
  // Neither runtime ends its state for such a thread: ASan's next thread finds the old one's
  // (a CHECK in asan_thread.cpp), TSan keeps it for ever.
  GTEST_SKIP() << "the sanitizers' runtimes do not survive a thread's raw exit";
#endif
  alarm(120);
  brisk_trim();
  brisk_stats before = Stats();
  for (int i = 0; i < 4; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, RawExitBody, nullptr), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);  // the kernel clears the thread id glibc waits on
  }
  EXPECT_GT(Stats().heaps_live, before.heaps_live);
  EXPECT_LE(HeapsLiveAfter(before.heaps_live, [] { brisk_trim(); }), before.heaps_live);
  CheckAndFreeLateBlocks();
  alarm(0);
}

}  // namespace
