// A report callback that forks (or opens a file) while brisk_check_heap runs it. The check holds its lock while
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

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "debug/block.h"
#include "tests/test_util.h"

namespace {

// Debug mode on, reports to callback (and the process goes on after them), and one debug
// block of 40 bytes whose canary is overwritten: each heap check reports it once.
unsigned char* DamagedBlockReportedTo(void (*callback)(const char*, size_t, void*)) {
  brisk_debug_enter();
  brisk::debug::set_keep_going(true);
  brisk_debug_set_report_callback(callback, nullptr);
  auto* p = static_cast<unsigned char*>(brisk_malloc(40));
  p[40] = 0;  // the canary
  return p;
}

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
  unsigned char* p = DamagedBlockReportedTo(ForkOnFirstReport);
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

// Runs body() in a child process and expects it to exit 0 within 30 s (a deadlock in a fork
// handler blocks every signal, so the child's own alarm could not end it).
template <class Body>
void ExpectExitsWell(Body body) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(body());
  int status = 0;
  ASSERT_TRUE(brisk_test::WaitForChild(pid, 30, &status)) << "the process deadlocked in the forking callback";
  ASSERT_TRUE(WIFEXITED(status)) << "died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DebugForkCallback, ACallbackThatForksDuringAHeapCheckDoesNotDeadlock) { ExpectExitsWell(ForkDuringACheck); }

// Another thread forks while a check's callback runs, and the callback then forks, or opens a
// file (which takes the C library's stdio list lock): fork's prepare handler took that lock
// before the check's, so the other thread's fork held it while it waited for the check, and the
// callback waited for it (a review's probe; the file case was older than the callback's fork).
std::atomic<bool> g_in_callback{false};
int g_callback_does = 0;  // 0: fork, 1: fopen
void SlowCallback(const char*, size_t, void*) {
  if (g_in_callback.exchange(true)) return;  // the first report only
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the other thread is in fork now
  if (g_callback_does == 0) {
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid(pid, nullptr, 0);
  } else if (FILE* f = fopen("/dev/null", "r")) {
    fclose(f);
  }
}

int CheckWhileAnotherThreadForks() {
  unsigned char* p = DamagedBlockReportedTo(SlowCallback);
  std::thread forker([] {
    while (!g_in_callback.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid(pid, nullptr, 0);
  });
  const int damaged = brisk_check_heap();
  forker.join();
  p[40] = brisk::debug::kGuardByte;
  brisk_free(p);
  return damaged == 1 ? 0 : 2;
}

TEST(DebugForkCallback, AnotherThreadsForkDuringACallbackThatForksDoesNotDeadlock) {
  g_callback_does = 0;
  ExpectExitsWell(CheckWhileAnotherThreadForks);
}

TEST(DebugForkCallback, AnotherThreadsForkDuringACallbackThatOpensAFileDoesNotDeadlock) {
  g_callback_does = 1;
  ExpectExitsWell(CheckWhileAnotherThreadForks);
}

// A check from a report callback of a check under way on the same thread returns -1 (it waited
// for its own lock before).
int g_nested = 0;
void CheckAgain(const char*, size_t, void*) { g_nested = brisk_check_heap(); }

int NestedCheck() {
  unsigned char* p = DamagedBlockReportedTo(CheckAgain);
  alarm(20);
  const int damaged = brisk_check_heap();
  p[40] = brisk::debug::kGuardByte;
  brisk_free(p);
  return damaged == 1 && g_nested == -1 ? 0 : 2;
}

TEST(DebugForkCallback, ACheckFromACheckCallbackReturnsMinusOne) { ExpectExitsWell(NestedCheck); }

}  // namespace
