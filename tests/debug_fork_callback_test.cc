// A report callback that forks while brisk_check_heap runs it. The check holds its lock while
// it calls the callback, and fork's prepare handler takes that lock: it waited for the thread
// that was forking, for ever. Now the handlers leave the lock to the check that holds it, in
// the parent and in the child, where the same thread goes on with the check and releases it.
// Run in a process of its own (with a second thread: a single-threaded process's fork takes no
// lock), so that a deadlock is a failure after a timeout, not a hang.
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "debug/block.h"

namespace {

pid_t g_forked = -1;  // the callback's fork: -1 before it, 0 in the child, the child's pid after

void ForkOnFirstReport(const char*, size_t, void*) {
  if (g_forked == -1) g_forked = fork();
}

// The callback's process (the check's parent) and the child: each checks the heap again
// after the forking check, so its lock must have come out of the fork free. Exit codes:
// 0 good, 2 the first check, 3 the child's check, 4 the child did not end well, 5 the
// parent's check after the repair.
int ForkDuringACheck() {
  // A second thread: fork's handlers take brisk's locks only in a multithreaded process.
  std::thread([] { pause(); }).detach();
  brisk_debug_enter();
  brisk::debug::set_keep_going(true);
  brisk_debug_set_report_callback(ForkOnFirstReport, nullptr);
  auto* p = static_cast<unsigned char*>(brisk_malloc(40));
  p[40] = 0;  // the canary
  if (brisk_check_heap() != 1) return 2;
  if (g_forked == 0) {
    alarm(20);
    void* q = brisk_malloc(100);
    brisk_free(q);
    _exit(brisk_check_heap() == 1 ? 0 : 3);
  }
  int status = 0;
  if (g_forked < 0 || waitpid(g_forked, &status, 0) != g_forked || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return 4;
  p[40] = brisk::debug::kGuardByte;
  if (brisk_check_heap() != 0) return 5;
  brisk_free(p);
  return 0;
}

TEST(DebugForkCallback, ACallbackThatForksDuringAHeapCheckDoesNotDeadlock) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(ForkDuringACheck());
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the process deadlocked in the forking callback";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
