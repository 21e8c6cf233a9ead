// Allocation and free after brisk's own key destructor has run on an exiting thread: glibc runs
// up to PTHREAD_DESTRUCTOR_ITERATIONS rounds of key destructors, and one that allocates in the
// last round has no later round to give a heap back in. Such a thread must never own a heap
// again, yet its blocks must be real, intact, and reclaimed.
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/platform.h"
#include "tests/test_util.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"

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

// ... unless it left with its heap's slow lock held (the exit system call from a signal handler
// that interrupted a slow path): that heap is left alone, and the sweep does not wait for ever.
void* RawExitHoldingTheSlowLock(void*) {
  brisk_free(brisk_malloc(16));  // a heap
  brisk::t_heap->slow_lock.lock();
  syscall(SYS_exit, 0);
  return nullptr;
}

TEST(ThreadExit, AGoneThreadsHeapWhoseSlowLockIsHeldIsLeftAlone) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' runtimes do not survive a thread's raw exit";
#endif
  alarm(60);  // a sweep that waits for the lock never ends
  brisk_trim();
  brisk_stats before = Stats();
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, RawExitHoldingTheSlowLock, nullptr), 0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);
  for (int i = 0; i < 5; ++i) {
    brisk_trim();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stats().heaps_live, before.heaps_live + 1);
  alarm(0);
}

// glibc reuses the descriptor of a thread gone by the exit system call without clearing its key
// values: a thread on that descriptor which never allocates runs brisk's key destructor at its
// exit with the gone thread's heap, which a sweep has given back and another thread may hold by
// then. The destructor must leave it alone (before, it detached that thread's live heap).
pthread_key_t g_probe_key;  // set by the gone thread: shows the next one reuses its descriptor
brisk::Heap* g_raw_heap = nullptr;
std::atomic<int> g_stage{0};

void* RawExitSettingAKey(void*) {
  brisk_free(brisk_malloc(16));
  g_raw_heap = brisk::t_heap;
  pthread_setspecific(g_probe_key, reinterpret_cast<void*>(uintptr_t{0x1234}));
  syscall(SYS_exit, 0);
  return nullptr;
}

void WaitForStage(int stage) {
  while (g_stage.load() < stage) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(ThreadExit, AStaleKeyValueOnAReusedThreadDescriptorIsIgnored) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' runtimes do not survive a thread's raw exit";
#endif
  alarm(60);
  ASSERT_EQ(pthread_key_create(&g_probe_key, nullptr), 0);
  brisk_trim();
  pthread_t r;
  ASSERT_EQ(pthread_create(&r, nullptr, RawExitSettingAKey, nullptr), 0);
  ASSERT_EQ(pthread_join(r, nullptr), 0);
  brisk_stats before = Stats();
  ASSERT_LE(HeapsLiveAfter(before.heaps_live - 1, [] { brisk_trim(); }), before.heaps_live - 1);  // r's heap pooled
  bool reused = false;
  std::thread m([&reused] {  // allocates nothing
    reused = pthread_getspecific(g_probe_key) == reinterpret_cast<void*>(uintptr_t{0x1234});
    WaitForStage(2);
  });
  brisk::Heap* a_heap = nullptr;
  uint64_t a_tid = 0;
  std::thread a([&] {
    void* p = brisk_malloc(100);  // takes r's heap from the pool
    a_heap = brisk::t_heap;
    a_tid = brisk::platform::current_thread_id();
    g_stage = 1;
    WaitForStage(3);
    Fill(p, 100, 5);
    EXPECT_TRUE(Verify(p, 100, 5));
    brisk_free(p);
  });
  WaitForStage(1);
  g_stage = 2;
  m.join();  // its exit runs brisk's key destructor with r's heap, unless the value was cleared
  const bool a_keeps_its_heap = a_heap->thread_id.load() == a_tid;
  const uint64_t live = Stats().heaps_live;
  g_stage = 3;
  a.join();
  g_stage = 0;
  pthread_key_delete(g_probe_key);
  alarm(0);
  if (!reused) GTEST_SKIP() << "the C library did not reuse the gone thread's descriptor";
  ASSERT_EQ(a_heap, g_raw_heap) << "the thread did not take the gone thread's heap";
  EXPECT_TRUE(a_keeps_its_heap) << "a thread's exit detached another thread's heap";
  EXPECT_EQ(live, before.heaps_live);
}

// A child of _Fork (no fork handlers run) keeps its parent's thread ids in every heap: they name
// no thread of the child, and must not be taken for gone threads' (the child's own heap, and the
// heaps of the parent's other threads, whose state a fork may have cut in the middle of a
// change).
TEST(ThreadExit, AChildOfForkWithoutHandlersReclaimsNoHeapOfItsParent) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' runtimes are not made for _Fork";
#endif
  alarm(60);
  brisk_free(brisk_malloc(16));
  std::atomic<bool> stop{false};
  std::atomic<bool> ready{false};
  std::thread other([&] {
    brisk_free(brisk_malloc(16));
    ready = true;
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  pid_t pid = _Fork();
  if (pid == 0) {
    const uint64_t live = Stats().heaps_live;
    brisk::Heap* own = brisk::t_heap;
    brisk_trim();
    int bad = 0;
    if (Stats().heaps_live != live) bad |= 1;
    if (own->thread_id.load() == 0 || brisk::t_heap != own) bad |= 2;
    void* p = brisk_malloc(200);
    Fill(p, 200, 9);
    if (!Verify(p, 200, 9)) bad |= 4;
    brisk_free(p);
    _exit(bad);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  stop = true;
  other.join();
  alarm(0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: heaps reclaimed in the child; 2: its own heap; 4: a block lost its contents";
}

}  // namespace
