// fork while another thread holds the forking thread's heap slow lock: a remote free of a
// medium block releases its pages under the owner's slow lock (free_remote_medium), so without
// prepare taking that lock the child inherits it held, and its first slow path on its own heap
// spins for ever.
//
// Replayed through the real code path: thread R frees medium blocks that the main thread's heap
// A owns. The main thread sends R SIGUSR1 repeatedly; R's handler parks (blocks on a pipe) only
// when it interrupted R while A's slow lock is held, which, with the main thread running no slow
// path and the background thread off (BRISK_BACKGROUND=0), means R is inside
// free_remote_medium. Every 8th block stays live, so no release empties a chunk, and
// BRISK_PURGE_BYTES=1g keeps heap_purge out: R holds no lock of prepare's. The main thread then
// forks; the child allocates a medium block (HeapSlowLock(A)) under alarm(5). R is woken 1 s
// after the fork starts, so a prepare that waits for A's lock completes.
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "threadcache/heap.h"

namespace {

brisk::Heap* g_owner = nullptr;
int g_pipe[2];
std::atomic<bool> g_parked{false};
std::atomic<bool> g_in_round{false};  // R is freeing; the main thread runs no slow path

void on_usr1(int) {
  if (!g_in_round.load() || !g_owner->slow_lock.is_locked()) return;
  if (g_parked.exchange(true)) return;  // park once (a later pending signal passes)
  char c;
  while (read(g_pipe[0], &c, 1) != 1) {
  }
}

TEST(ForkHeapLock, ForkWhileARemoteMediumFreeHoldsTheForkersSlowLock) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "ThreadSanitizer defers asynchronous signals, so the handler cannot catch R in the window";
#endif
  ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0");
  ASSERT_EQ(pipe(g_pipe), 0);
  struct sigaction sa {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, nullptr), 0);
  brisk_free(brisk_malloc(64));
  g_owner = brisk::t_heap;
  ASSERT_TRUE(brisk::heap_is_attached(g_owner));

  constexpr std::size_t kSize = brisk::kSmallMax + 16;  // a 2-page medium block
  constexpr int kBlocks = 4000;
  std::vector<void*> blocks;
  std::atomic<int> round{0}, done{0};
  std::atomic<bool> stop{false};
  std::thread r([&] {
    brisk_free(brisk_malloc(64));  // a heap of its own: its frees of A's blocks are remote
    for (int seen = 0;;) {
      while (round.load() == seen && !stop.load()) std::this_thread::yield();
      if (stop.load()) return;
      seen = round.load();
      g_in_round.store(true);
      for (int i = 0; i < kBlocks; ++i)
        if (i % 8 != 0) brisk_free(blocks[i]);
      g_in_round.store(false);
      done.store(seen);
    }
  });
  for (int n = 1; n <= 1000 && !g_parked.load(); ++n) {
    blocks.clear();
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(kSize));
    round.store(n);
    while (done.load() != n && !g_parked.load()) pthread_kill(r.native_handle(), SIGUSR1);
    for (int i = 0; i < kBlocks && !g_parked.load(); i += 8) brisk_free(blocks[i]);
  }
  ASSERT_TRUE(g_parked.load()) << "never caught R inside free_remote_medium";
  ASSERT_TRUE(g_owner->slow_lock.is_locked());

  // R is released 1 s from now: with the bug, the fork is long done by then; with a prepare
  // handler that waits for the forking thread's slow lock, the fork waits for R's unlock.
  std::thread waker([] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    (void)!write(g_pipe[1], "x", 1);
  });
  pid_t pid = fork();
  if (pid == 0) {
    alarm(5);
    void* p = brisk_malloc(256 << 10);  // alloc_medium: HeapSlowLock(A)
    _exit(p != nullptr ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  waker.join();
  stop.store(true);
  r.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "fork child "
      << (WIFSIGNALED(status) ? (WTERMSIG(status) == SIGALRM ? "hung (SIGALRM): its heap's slow lock was held"
                                                               : "killed by a signal")
                              : "exited non-zero");
}

}  // namespace
