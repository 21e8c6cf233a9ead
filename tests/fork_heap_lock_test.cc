// fork while another thread holds the forking thread's heap slow lock: a remote free of a
// medium block releases its pages under the owner's slow lock (free_remote_medium), so without
// prepare taking that lock the child inherits it held, and its first slow path on its own heap
// spins for ever.
//
// Replayed through the real code path: thread R frees a medium block that the main thread's
// heap A owns, and a test hook parks R inside free_remote_medium with A's slow lock held (a
// signal sent to R, this test's first form, caught it there too rarely on a loaded machine: one
// run in several under ctest -j2 never did in 1,000 rounds). BRISK_BACKGROUND=0: no other thread
// takes A's lock. The main thread then forks; the child allocates a medium block
// (HeapSlowLock(A)) under alarm(5). R is woken 1 s after the fork starts, so a prepare that
// waits for A's lock completes.
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/platform.h"
#include "debug/block.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"
#include "threadcache/remote_free.h"

namespace {

brisk::Heap* g_owner = nullptr;
int g_pipe[2];
std::atomic<bool> g_parked{false};

// Parks the calling thread (R, from a test hook) once, until the waker
// writes; a later call passes.
void park_once() {
  if (g_parked.exchange(true)) return;
  char c;
  while (read(g_pipe[0], &c, 1) != 1) {
  }
}

// R is released 1 s from now: with the bug, the fork is long done by then; with a prepare
// handler that waits for the lock R holds, the fork waits for R's unlock. The child allocates a
// block of `size` bytes under alarm(5). Returns the child's wait status.
int ForkWhileRIsParked(std::size_t size) {
  std::thread waker([] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    (void)!write(g_pipe[1], "x", 1);
  });
  pid_t pid = fork();
  if (pid == 0) {
    alarm(5);
    void* p = brisk_malloc(size);
    _exit(p != nullptr ? 0 : 1);
  }
  int status = -1;
  if (pid > 0 && waitpid(pid, &status, 0) != pid) status = -1;
  waker.join();
  return status;
}

// Runs r_body on a thread R until a test hook parks it (park_once), runs while_parked, then forks
// (ForkWhileRIsParked: a child that allocates `size` bytes), and joins R. Forked whether or not
// R parked, so that R is woken and joined before any assertion fails. *parked: whether it did.
// The alarm fails a parent that never returns from fork (a lock-order deadlock in prepare)
// instead of leaving the test hanging.
template <class Body, class WhileParked>
int ForkWhileThreadIsParked(Body r_body, WhileParked while_parked, std::size_t size, bool* parked) {
  g_parked.store(false);
  if (pipe(g_pipe) != 0) return -1;
  std::thread r(r_body);
  for (int i = 0; i < 10000 && !g_parked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  *parked = g_parked.load();
  while_parked();
  alarm(30);
  const int status = ForkWhileRIsParked(size);
  alarm(0);
  r.join();
  return status;
}

void ExpectTheChildAllocated(int status, const char* lock) {
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "fork child "
      << (WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung (SIGALRM): " : "killed by a signal: ")
                              : "exited non-zero: ")
      << lock << " was held";
}

void park_in_remote_medium(brisk::Heap* owner) {
  if (owner == g_owner) park_once();
}

TEST(ForkHeapLock, ForkWhileARemoteMediumFreeHoldsTheForkersSlowLock) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer's exit check in the child reports the parent's other threads as leaked";
#endif
  ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0");
  brisk_free(brisk_malloc(64));
  g_owner = brisk::t_heap;
  ASSERT_TRUE(brisk::heap_is_attached(g_owner));
  constexpr std::size_t kSize = brisk::kSmallMax + 16;  // a 2-page medium block
  void* keep = brisk_malloc(kSize);  // the span's neighbour stays: the chunk does not empty
  void* block = brisk_malloc(kSize);
  brisk::g_remote_medium_test_hook.store(park_in_remote_medium);
  bool parked = false, held = false;
  const int status = ForkWhileThreadIsParked(
      [block] {
        brisk_free(brisk_malloc(64));  // a heap of its own: its free of A's block is remote
        brisk_free(block);
      },
      [&held] { held = g_owner->slow_lock.is_locked(); }, 256 << 10, &parked);  // alloc_medium: HeapSlowLock(A)
  brisk::g_remote_medium_test_hook.store(nullptr);
  brisk_free(keep);
  ASSERT_TRUE(parked) << "R never reached free_remote_medium";
  ASSERT_TRUE(held);
  ExpectTheChildAllocated(status, "its heap's slow lock");
}

// The same for the forking thread's debug heap, whose slow lock brisk_trim takes with try_lock
// (heap_give_back_kept_tried gives back its cached medium runs and spares). Thread R runs
// brisk_trim, and the test hook parks it in heap_give_back_kept_tried while it holds the main
// thread's debug heap's lock (a signal, as above, caught R there too rarely on a loaded
// machine: the lock is held for a few microseconds). The child allocates a medium debug block
// (HeapSlowLock of the debug heap) under alarm(5).
brisk::Heap* g_debug_owner = nullptr;

void park_in_give_back(brisk::Heap* h) {
  if (h == g_debug_owner) park_once();
}

TEST(ForkHeapLock, ForkWhileATrimHoldsTheForkersDebugHeapSlowLock) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer's exit check in the child reports the parent's other threads as leaked";
#endif
  brisk_debug_enter();
  constexpr std::size_t kSize = brisk::kSmallMax + 16;  // a 2-page medium block (with its header)
  brisk_free(brisk_malloc(kSize));
  g_debug_owner = brisk::t_heap->debug;
  ASSERT_NE(g_debug_owner, nullptr);
  brisk::g_give_back_test_hook.store(park_in_give_back);
  bool parked = false, held = false;
  // The child's debug block: alloc_medium, HeapSlowLock(debug heap).
  const int status = ForkWhileThreadIsParked(
      [] { brisk_trim(); }, [&held] { held = g_debug_owner->slow_lock.is_locked(); }, kSize, &parked);
  brisk::g_give_back_test_hook.store(nullptr);
  brisk_debug_exit();
  ASSERT_TRUE(parked) << "brisk_trim never reached the main thread's debug heap";
  ASSERT_TRUE(held);
  ExpectTheChildAllocated(status, "its debug heap's slow lock");
}

// fork while the background pass is about to empty idle quarantine shards (debug mode): that
// work takes the debug layer's locks (shards', live locks, the report sink's), which prepare
// takes before the pass lock, so it must run without the pass lock held. Thread R's pass is
// parked by the test hook before it takes any lock; the main thread forks. Had R held the pass
// lock there, prepare would take every debug lock, wait for the pass lock, and R, woken 1 s
// later, would wait for a shard's lock: the parent would never return from fork (the alarm of
// ForkWhileThreadIsParked ends the test then). The child allocates a debug block under alarm(5).
void park_in_idle_quarantine() { park_once(); }

TEST(ForkHeapLock, ForkWhileTheBackgroundPassEmptiesIdleQuarantineShards) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer's exit check in the child reports the parent's other threads as leaked";
#endif
  brisk_debug_enter();
  brisk_free(brisk_malloc(100));  // the debug layer set up, a block in the quarantine
  brisk::debug::g_idle_quarantine_test_hook.store(park_in_idle_quarantine);
  bool parked = false;
  const int status = ForkWhileThreadIsParked([] { brisk::background_pass(brisk::platform::now_ms()); }, [] {}, 100, &parked);
  brisk::debug::g_idle_quarantine_test_hook.store(nullptr);
  brisk_debug_exit();
  ASSERT_TRUE(parked) << "the background pass never reached the quarantine";
  ExpectTheChildAllocated(status, "a debug-layer lock");
}

}  // namespace
