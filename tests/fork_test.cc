// fork under brisk: one program, one case per run (`fork_test CASE`), exit status 0 on success.
// Registered with libbrisk.so preloaded; the ports of glibc's tests run once more without it, as
// a control that the test itself passes under glibc's malloc.
//
//   malloc-fork-deadlock  port of glibc's tst-malloc-fork-deadlock: threads fork while others
//                         read a long line with getline() and one calls fflush(NULL)
//   mallocfork2           port of tst-mallocfork2: a single-threaded process forks from a
//                         signal handler that interrupted malloc, free or fork
//   mallocfork            port of tst-mallocfork: a signal handler forks while the same thread
//                         may still be inside fork (nested fork)
//   mallocfork3           port of tst-mallocfork3: _Fork from a signal handler that interrupted
//                         malloc or free in a multithreaded process
//   stdio                 getline() on a 1.9 MB line (brisk's slow paths, under the stream's
//                         lock), fflush(NULL) in a loop, the main thread forks
//   exit                  exit() in one thread (destructors, then frees under the stdio list
//                         lock) while three others fork
//   locks                 other threads keep every brisk lock busy while the main thread forks;
//                         each child allocates every kind of block and runs a thread
//   debug                 the same in debug mode (run with BRISK_DEBUG=1 BRISK_DEBUG_ACTION=report):
//                         other threads keep the debug layer's locks busy (debug heaps, the
//                         quarantine, the report sink, brisk_check_heap); each child makes,
//                         frees and checks debug blocks and gets the report of an overrun
//   debug-check-loop      debug mode (BRISK_DEBUG=1): a thread calls brisk_check_heap back to
//                         back while the main thread forks; each fork waits for at most the
//                         check under way (the check lock is fair)
//   debug-idle            debug mode (BRISK_DEBUG=1 BRISK_IDLE_MS=10): threads free debug blocks
//                         in bursts, so the background thread keeps emptying idle quarantine
//                         shards, while the main thread forks
//
// Every case arms a watchdog (alarm) that fails it on a hang instead of leaving that to ctest.
// Written from what glibc's tests check; the iteration counts are smaller, to stay within seconds.
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include <algorithm>
#include <atomic>

namespace {

const char* g_case = "";

void Say(const char* a, const char* b = "", const char* c = "") {
  const char* parts[] = {"fork_test ", g_case, ": ", a, b, c, "\n"};
  for (const char* p : parts) {
    ssize_t ignored = write(STDERR_FILENO, p, strlen(p));
    (void)ignored;
  }
}

[[noreturn]] void Fail(const char* what, const char* detail = "") {
  Say("FAIL: ", what, detail);
  _exit(1);
}

pid_t g_main_pid;

void OnWatchdog(int) {
  Say(getpid() == g_main_pid ? "FAIL: watchdog: still running (deadlock?)"
                             : "FAIL: watchdog: a fork child is still running (deadlock?)");
  _exit(1);
}

// alarm() is not inherited by fork children: a child that should be bounded arms its own.
void ArmWatchdog(unsigned seconds) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnWatchdog;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  alarm(seconds);
}

void InstallHandler(int sig, void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, nullptr) != 0) Fail("sigaction");
}

// Waits for pid (retrying on EINTR) and returns its raw status.
int Reap(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pid) Fail("waitpid");
  return status;
}

pthread_t Spawn(void* (*fn)(void*), void* arg = nullptr) {
  pthread_t t;
  if (pthread_create(&t, nullptr, fn, arg) != 0) Fail("pthread_create");
  return t;
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::atomic<bool> g_stop{false};
// Pauses between the stdio threads' calls (0: none, as in glibc's test): a futex lock is not
// fair, and a thread that takes it back at once can starve fork of _IO_list_lock for seconds.
unsigned g_reader_pause_us = 0;
char g_file[64];

// A temporary file of `lines` lines of `length` 'x' each; deleted at exit.
void WriteLineFile(size_t length, int lines) {
  strcpy(g_file, "/tmp/brisk-fork-test-XXXXXX");
  int fd = mkstemp(g_file);
  if (fd < 0) Fail("mkstemp");
  FILE* f = fdopen(fd, "w");
  if (f == nullptr) Fail("fdopen");
  for (int l = 0; l < lines; ++l) {
    for (size_t i = 0; i < length; ++i) fputc('x', f);
    fputc('\n', f);
  }
  if (fclose(f) != 0) Fail("fclose");
  atexit([] { unlink(g_file); });
}

// Reads the file line by line with a fresh buffer each time, so getline grows (reallocs) it
// while it holds the stream's lock.
void* ReadLines(void*) {
  FILE* f = fopen(g_file, "r");
  if (f == nullptr) Fail("fopen");
  // A big buffer keeps a multi-MiB line to a few read() calls while the stream is locked.
  if (setvbuf(f, nullptr, _IOFBF, 1 << 20) != 0) Fail("setvbuf");
  while (!g_stop.load(std::memory_order_relaxed)) {
    rewind(f);
    char* line = nullptr;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
      free(line);
      line = nullptr;
      cap = 0;
      if (g_stop.load(std::memory_order_relaxed)) break;
      if (g_reader_pause_us != 0) usleep(g_reader_pause_us);
    }
    free(line);
    if (ferror(f)) Fail("getline");
  }
  fclose(f);
  return nullptr;
}

void* FlushAll(void*) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (fflush(nullptr) != 0) Fail("fflush(NULL)");
    if (g_reader_pause_us != 0) usleep(g_reader_pause_us / 4);
  }
  return nullptr;
}

// Forks, lets the child _exit(17) at once, and checks that it did.
void ForkTrivialChild() {
  pid_t pid = fork();
  if (pid < 0) Fail("fork: ", strerror(errno));
  if (pid == 0) _exit(17);
  int status = Reap(pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 17) Fail("child exit status");
}

void* ForkUntilStopped(void*) {
  while (!g_stop.load(std::memory_order_relaxed)) ForkTrivialChild();
  return nullptr;
}

// ---- tst-malloc-fork-deadlock -----------------------------------------------------------------
int MallocForkDeadlock() {
  ArmWatchdog(60);
  WriteLineFile(50000, 1);
  pthread_t forkers[4], readers[8], flusher;
  for (auto& t : forkers) t = Spawn(ForkUntilStopped);
  for (auto& t : readers) t = Spawn(ReadLines);
  flusher = Spawn(FlushAll);
  timespec run = {2, 0};
  while (nanosleep(&run, &run) != 0 && errno == EINTR) {
  }
  g_stop = true;
  pthread_join(flusher, nullptr);
  for (auto& t : readers) pthread_join(t, nullptr);
  for (auto& t : forkers) pthread_join(t, nullptr);
  return 0;
}

// ---- tst-mallocfork2 and tst-mallocfork3: fork (or _Fork) from a signal handler ---------------
volatile sig_atomic_t g_signal_seen;
volatile sig_atomic_t g_handler_error;
bool g_handler_uses_underscore_fork;

void ForkFromHandler(int) {
  g_signal_seen = 1;
  int saved = errno;
  pid_t pid = g_handler_uses_underscore_fork ? _Fork() : fork();
  if (pid < 0) {
    g_handler_error = 1;
  } else if (pid == 0) {
    _exit(0);
  } else {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    if (r != pid || status != 0) g_handler_error = 1;
  }
  errno = saved;
}

constexpr int kSenders = 5;
constexpr int kObjects = 1009;
constexpr size_t kMaxObjectSize = 70000;

pthread_barrier_t* g_barrier;
pthread_t g_main_thread;

// The senders and the main loop meet at the barrier twice per iteration, so the signals land
// while the main thread is in fork, free or malloc.
[[noreturn]] void SendSignalsToParent() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  pid_t target = getppid();
  for (;;) {
    pthread_barrier_wait(g_barrier);
    if (kill(target, SIGUSR1) != 0) _exit(1);
    pthread_barrier_wait(g_barrier);
  }
}

void* SendSignalsToMainThread(void*) {
  for (;;) {
    pthread_barrier_wait(g_barrier);
    if (pthread_kill(g_main_thread, SIGUSR1) != 0) Fail("pthread_kill");
    pthread_barrier_wait(g_barrier);
  }
  return nullptr;
}

// The main loop of both ports: free and malloc random sizes, and fork now and then, while the
// senders interrupt it.
int MallocFreeForkUnderSignals(int iterations, bool underscore_fork) {
  void* objects[kObjects] = {};
  unsigned seed = 1;
  unsigned in_fork = 0, in_free = 0, in_malloc = 0;
  for (int i = 0; i < iterations; ++i) {
    int slot = rand_r(&seed) % kObjects;
    size_t size = rand_r(&seed) % kMaxObjectSize;
    bool do_fork = rand_r(&seed) % 7 == 0;
    pthread_barrier_wait(g_barrier);
    if (do_fork) {
      g_signal_seen = 0;
      pid_t pid = underscore_fork ? _Fork() : fork();
      if (pid < 0) Fail("fork");
      in_fork += g_signal_seen;
      if (pid == 0) _exit(0);
      if (Reap(pid) != 0) Fail("child exit status");
    }
    g_signal_seen = 0;
    free(objects[slot]);
    in_free += g_signal_seen;
    g_signal_seen = 0;
    objects[slot] = malloc(size);
    in_malloc += g_signal_seen;
    pthread_barrier_wait(g_barrier);
    if (objects[slot] == nullptr) Fail("malloc returned NULL");
    if (g_handler_error) Fail("fork in the signal handler failed");
  }
  for (void* p : objects) free(p);
  fprintf(stderr, "signals during fork %u, free %u, malloc %u\n", in_fork, in_free, in_malloc);
  return 0;
}

int MallocFork2() {
  ArmWatchdog(60);
  InstallHandler(SIGUSR1, ForkFromHandler);
  // Process-shared: the senders are processes, so that this one stays single-threaded.
  void* shared = mmap(nullptr, sizeof(pthread_barrier_t), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) Fail("mmap");
  g_barrier = static_cast<pthread_barrier_t*>(shared);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(g_barrier, &attr, kSenders + 1);
  pid_t senders[kSenders];
  for (pid_t& s : senders) {
    s = fork();
    if (s < 0) Fail("fork");
    if (s == 0) SendSignalsToParent();
  }
  int rc = MallocFreeForkUnderSignals(400, false);
  signal(SIGUSR1, SIG_IGN);
  for (pid_t s : senders) kill(s, SIGKILL);
  for (pid_t s : senders) Reap(s);
  return rc;
}

int MallocFork3() {
  ArmWatchdog(60);
  g_handler_uses_underscore_fork = true;
  InstallHandler(SIGUSR1, ForkFromHandler);
  static pthread_barrier_t barrier;
  g_barrier = &barrier;
  pthread_barrier_init(g_barrier, nullptr, kSenders + 1);
  g_main_thread = pthread_self();
  // The senders must not take SIGUSR1 themselves.
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, &old);
  for (int i = 0; i < kSenders; ++i) Spawn(SendSignalsToMainThread);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  // The senders loop forever; exit() ends them.
  return MallocFreeForkUnderSignals(400, true);
}

// ---- tst-mallocfork: nested fork ---------------------------------------------------------------
void ForkAndExitFromHandler(int) {
  int saved = errno;
  pid_t pid = fork();
  if (pid == 0) exit(0);
  if (pid > 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  errno = saved;
}

int MallocForkNested() {
  ArmWatchdog(60);
  InstallHandler(SIGUSR1, ForkAndExitFromHandler);
  pid_t parent = getpid();
  // The child signals at once, so the signal often arrives while the parent is still in fork.
  for (int round = 0; round < 150; ++round) {
    void* p = malloc(sizeof(int));
    pid_t child = fork();
    if (child < 0) Fail("fork");
    if (child == 0) {
      if (kill(parent, SIGUSR1) != 0) _exit(1);
      exit(0);
    }
    free(p);
    int status = Reap(child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("child exit status");
  }
  return 0;
}

// ---- stdio: getline on long lines, fflush(NULL), fork ------------------------------------------
int StdioFork() {
  ArmWatchdog(30);
  // A 1.9 MB line: getline's buffer grows through small and medium blocks (brisk's central pools
  // and chunk lists) while the reader holds the stream's lock. It doubles from 120 bytes, so its
  // last size is 1,966,080 bytes, still medium.
  WriteLineFile(1900000, 1);
  g_reader_pause_us = 1000;
  pthread_t readers[2], flusher;
  for (auto& t : readers) t = Spawn(ReadLines);
  flusher = Spawn(FlushAll);
  constexpr int kForks = 50;
  for (int i = 0; i < kForks; ++i) {
    pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) {
      alarm(5);  // the child must be able to allocate
      void* p = malloc(3 << 20);
      if (p == nullptr) _exit(2);
      free(p);
      _exit(17);
    }
    int status = Reap(pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 17) Fail("child did not exit 17");
  }
  g_stop = true;
  pthread_join(flusher, nullptr);
  for (auto& t : readers) pthread_join(t, nullptr);
  fprintf(stderr, "%d forks\n", kForks);
  return 0;
}

// ---- exit: exit() in one thread while others fork ----------------------------------------------
// exit() runs the libraries' destructors, where glibc drops the fork handlers that
// pthread_atfork tied to each library: a fork whose prepare handler already ran must still get
// its parent handler, or the stdio list lock stays taken and exit() waits for it in its final
// flush. exit() also frees the buffers of wide-oriented streams under that lock; buffers of a
// thread that has exited lie in orphaned spans, so that free takes a central pool's lock.
void* OpenWideStreams(void*) {
  for (int i = 0; i < 100; ++i) {
    FILE* f = fopen("/dev/null", "w");
    if (f == nullptr) Fail("fopen");
    if (fwide(f, 1) <= 0 || fputwc(L'x', f) == WEOF) Fail("fputwc");  // allocates the buffer
  }
  return nullptr;
}

[[noreturn]] void ExitWhileForking() {
  alarm(5);
  pthread_join(Spawn(OpenWideStreams), nullptr);
  for (int i = 0; i < 3; ++i) Spawn(ForkUntilStopped);
  usleep(1000);
  exit(0);
}

int ExitFork() {
  ArmWatchdog(60);
  constexpr int kRounds = 50;
  for (int round = 0; round < kRounds; ++round) {
    pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) ExitWhileForking();
    int status = Reap(pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("a process that called exit(0) while forking did not exit 0");
  }
  fprintf(stderr, "%d rounds\n", kRounds);
  return 0;
}

// ---- locks: every brisk lock busy in other threads while the main thread forks ------------------
constexpr size_t kOrphanClassSize = 48;  // the small class whose central pool the threads share
constexpr int kHandoff = 256;
std::atomic<void*> g_handoff[kHandoff];

// The large cache's lock: every large free takes it, and a large malloc when the cache is not
// empty.
void* LargeLoop(void*) {
  for (size_t i = 0; !g_stop.load(std::memory_order_relaxed); ++i) {
    char* p = static_cast<char*>(malloc((3 << 20) + (i % 4) * 65536));
    if (p == nullptr) Fail("large malloc");
    p[0] = 1;
    free(p);
  }
  return nullptr;
}

// The chunk registry and chunk cache locks: medium blocks beyond what one chunk holds, so
// chunks are claimed, created and destroyed.
void* MediumLoop(void*) {
  void* blocks[6];
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (void*& b : blocks)
      if ((b = malloc(1 << 20)) == nullptr) Fail("medium malloc");
    for (void* b : blocks) free(b);
  }
  return nullptr;
}

// A short-lived thread: it leaves blocks of one class for another thread to free, so its exit
// orphans spans (central pool lock), abandons chunks (abandoned list lock) and returns its heap
// (heap pool lock).
void* ShortLived(void* arg) {
  unsigned seed = static_cast<unsigned>(reinterpret_cast<uintptr_t>(arg));
  for (int i = 0; i < 64; ++i) {
    void* p = malloc(kOrphanClassSize);
    if (p == nullptr) Fail("small malloc");
    void* old = g_handoff[rand_r(&seed) % kHandoff].exchange(p);
    free(old);
  }
  return nullptr;
}

void* ThreadChurn(void*) {
  for (uintptr_t i = 0; !g_stop.load(std::memory_order_relaxed); ++i) {
    pthread_t t = Spawn(ShortLived, reinterpret_cast<void*>(i));
    pthread_join(t, nullptr);
  }
  return nullptr;
}

// Frees the blocks the short-lived threads left, after their threads exited: through the orphan
// queue and the central pool's lock.
void* CrossFree(void*) {
  unsigned seed = 7;
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* p = g_handoff[rand_r(&seed) % kHandoff].exchange(nullptr);
    free(p);
    if (p == nullptr) sched_yield();
  }
  return nullptr;
}

void* ChildThread(void*) {
  // Leaves live blocks behind: its exit hands spans to the central pools.
  static void* keep[100];
  for (void*& p : keep) p = malloc(kOrphanClassSize);
  return nullptr;
}

// A child of the forking parent: allocates every kind of block, runs a thread, exits 0. Any lock
// that the parent's threads held at fork and that was not released in the child hangs it.
[[noreturn]] void AllocateEverything() {
  alarm(5);
  void* small[300];
  for (int i = 0; i < 300; ++i)
    if ((small[i] = malloc(kOrphanClassSize + (i % 3) * 1000)) == nullptr) _exit(2);
  void* medium[6];
  for (void*& m : medium)
    if ((m = malloc(1 << 20)) == nullptr) _exit(3);
  void* large = malloc(5 << 20);
  void* aligned = nullptr;
  if (large == nullptr || posix_memalign(&aligned, 1 << 20, 1000) != 0) _exit(4);
  memset(large, 1, 4096);
  pthread_t t;
  if (pthread_create(&t, nullptr, ChildThread, nullptr) != 0) _exit(5);
  pthread_join(t, nullptr);
  for (void* p : small) free(p);
  for (void* m : medium) free(m);
  free(large);
  free(aligned);
  _exit(0);
}

// Forks `forks` times while `threads` run; each child runs child(), which exits 0 when all went
// well. Then stops and joins the threads and frees what they left in g_handoff.
template <size_t kThreads>
void ForkWhileThreadsRun(int forks, void (*child)(), pthread_t (&threads)[kThreads]) {
  double start = Now();
  for (int i = 0; i < forks; ++i) {
    pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) child();
    int status = Reap(pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      char msg[128];
      snprintf(msg, sizeof msg, "child of fork %d %s %d", i,
               WIFSIGNALED(status) ? "killed by signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      Fail(msg, " (a lock held at fork was left locked in the child? the watchdog's exit code is 1)");
    }
  }
  g_stop = true;
  for (pthread_t t : threads) pthread_join(t, nullptr);
  for (auto& h : g_handoff) free(h.exchange(nullptr));
  fprintf(stderr, "%d forks in %.1f s\n", forks, Now() - start);
}

int LocksBusyFork() {
  if (dlsym(RTLD_DEFAULT, "brisk_get_stats") == nullptr) Fail("brisk is not loaded");
  ArmWatchdog(120);
  pthread_t threads[] = {Spawn(LargeLoop), Spawn(MediumLoop), Spawn(ThreadChurn), Spawn(CrossFree)};
  ForkWhileThreadsRun(100, AllocateEverything, threads);
  return 0;
}

// ---- debug: every lock of the debug layer busy in other threads while the main thread forks -----
using CheckHeapFn = int (*)();
using ReportCallbackFn = void (*)(const char*, size_t, void*);
using SetReportCallbackFn = void (*)(ReportCallbackFn, void*);
CheckHeapFn g_check_heap;
SetReportCallbackFn g_set_report_callback;
std::atomic<long> g_debug_reports{0};

void CountReport(const char*, size_t, void*) { g_debug_reports.fetch_add(1, std::memory_order_relaxed); }

// A debug block that the compiler cannot see through, so no write to it is diagnosed or elided.
char* OpaqueMalloc(size_t size) {
  static void* volatile sink;
  sink = malloc(size);
  return static_cast<char*>(sink);
}

// Debug blocks of every kind made here and freed by CrossFree: the debug heaps' live locks on
// both sides, the quarantine's shards and the remote frees back to this thread's debug heap.
// (ThreadChurn's short-lived threads make debug blocks too: new debug heaps join the registry
// under its lock, and exiting ones are parked.)
void* DebugAllocator(void* arg) {
  unsigned seed = static_cast<unsigned>(reinterpret_cast<uintptr_t>(arg));
  for (size_t i = 0; !g_stop.load(std::memory_order_relaxed); ++i) {
    size_t size = i % 64 == 0 ? (3 << 20) : i % 8 == 0 ? 100000 : 16 + rand_r(&seed) % 2000;
    void* p = malloc(size);
    if (p == nullptr) Fail("debug malloc");
    free(g_handoff[rand_r(&seed) % kHandoff].exchange(p));
  }
  return nullptr;
}
// brisk_check_heap again and again: its lock and, in turn, every debug heap's and shard's. The
// pause leaves the other threads room; debug-check-loop checks without one.
void* DebugChecker(void*) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (g_check_heap() != 0) Fail("brisk_check_heap found damage in the parent");
    usleep(100);
  }
  return nullptr;
}
// A free_sized with a wrong size in a loop: a report each time (the report sink's lock); the
// block is freed all the same, and no block is ever damaged.
using FreeSizedFn = void (*)(void*, size_t);
FreeSizedFn g_free_sized;
void* DebugReporter(void*) {
  while (!g_stop.load(std::memory_order_relaxed)) g_free_sized(malloc(24), 25);
  return nullptr;
}
char g_child_report[4096];
size_t g_child_report_length;
void KeepReport(const char* text, size_t length, void*) {
  if (length >= sizeof g_child_report) length = sizeof g_child_report - 1;
  memcpy(g_child_report, text, length);
  g_child_report[length] = '\0';
  g_child_report_length = length;
}

void* ChildDebugThread(void*) {
  char* p = OpaqueMalloc(40);
  if (malloc_usable_size(p) != 40) _exit(20);
  free(p);
  return nullptr;
}

// A child of the forking parent: debug blocks of every kind (each of its exact size and filled
// with the allocation byte), freed; a thread that makes one; a clean heap check over every debug
// heap copied from the parent; and the report of an overrun through its own callback.
[[noreturn]] void UseDebugModeInChild() {
  alarm(10);
  const size_t sizes[] = {1, 24, 1000, 60000, 100000, 3 << 20};
  for (size_t size : sizes) {
    unsigned char* p = reinterpret_cast<unsigned char*>(OpaqueMalloc(size));
    if (p == nullptr) _exit(11);
    if (malloc_usable_size(p) != size) _exit(12);  // a debug block: its exact size
    if (p[0] != 0xA5 || p[size - 1] != 0xA5) _exit(13);
    free(p);
  }
  pthread_t t;
  if (pthread_create(&t, nullptr, ChildDebugThread, nullptr) != 0) _exit(14);
  pthread_join(t, nullptr);
  if (g_check_heap() != 0) _exit(15);
  g_set_report_callback(KeepReport, nullptr);
  volatile char* q = OpaqueMalloc(32);
  q[32] = '!';
  free(const_cast<char*>(q));
  if (strstr(g_child_report, "brisk: overrun") == nullptr || strstr(g_child_report, "32(1)") == nullptr) {
    Say("child: no overrun report; got: ", g_child_report);
    _exit(16);
  }
  _exit(0);
}

int DebugBusyFork() {
  auto active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "brisk_debug_active"));
  g_check_heap = reinterpret_cast<CheckHeapFn>(dlsym(RTLD_DEFAULT, "brisk_check_heap"));
  g_set_report_callback = reinterpret_cast<SetReportCallbackFn>(dlsym(RTLD_DEFAULT, "brisk_debug_set_report_callback"));
  g_free_sized = reinterpret_cast<FreeSizedFn>(dlsym(RTLD_DEFAULT, "free_sized"));
  if (active == nullptr || g_check_heap == nullptr || g_set_report_callback == nullptr || g_free_sized == nullptr)
    Fail("brisk is not loaded");
  if (active() == 0) Fail("run with BRISK_DEBUG=1 BRISK_DEBUG_ACTION=report");
  g_set_report_callback(CountReport, nullptr);
  ArmWatchdog(120);
  pthread_t threads[] = {Spawn(DebugAllocator, reinterpret_cast<void*>(1)), Spawn(CrossFree),
                         Spawn(DebugChecker), Spawn(DebugReporter), Spawn(ThreadChurn)};
  ForkWhileThreadsRun(25, UseDebugModeInChild, threads);
  if (g_debug_reports.load() == 0) Fail("the reporter thread's wrong sizes were not reported");
  return 0;
}

// ---- debug-check-loop: brisk_check_heap back to back while the main thread forks ---------------
// The checks completed between this program's prepare handler, which runs before brisk's
// (handlers registered later are called first), and its parent handler, which runs after
// brisk's: the checks that went ahead of fork for brisk's check lock. With the fair lock, the one
// under way, one that took its turn before brisk's prepare asked, and one made between brisk's
// parent handler and this one, more only if the forking thread is preempted in between: a median
// of 1-2 over 20 forks, at most 18 (5 runs). Before, with a spin lock (whose holder takes it
// again before a waiter that yielded looks), a median of 2,462-8,763 and at most 53,428.
std::atomic<long> g_checks{0};
long g_checks_at_prepare = 0;
long g_checks_ahead[20];
int g_forks_made = 0;
void* CheckLoop(void*) {
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (g_check_heap() != 0) Fail("brisk_check_heap found damage");
    g_checks.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

int DebugCheckLoopFork() {
  auto active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "brisk_debug_active"));
  g_check_heap = reinterpret_cast<CheckHeapFn>(dlsym(RTLD_DEFAULT, "brisk_check_heap"));
  if (active == nullptr || g_check_heap == nullptr) Fail("brisk is not loaded");
  if (active() == 0) Fail("run with BRISK_DEBUG=1");
  ArmWatchdog(120);
  static void* live[500];
  for (size_t i = 0; i < 500; ++i) live[i] = OpaqueMalloc(16 + i * 8);  // work for each check
  pthread_atfork([] { g_checks_at_prepare = g_checks.load(); },
                 [] {
                   if (g_forks_made < 20) g_checks_ahead[g_forks_made++] = g_checks.load() - g_checks_at_prepare;
                 },
                 nullptr);
  pthread_t checker = Spawn(CheckLoop);
  for (int i = 0; i < 20; ++i) {
    while (g_checks.load() < 10L * (i + 1)) usleep(100);  // the loop is under way
    pid_t pid = fork();
    if (pid < 0) Fail("fork");
    if (pid == 0) _exit(0);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("child");
  }
  g_stop.store(true);
  pthread_join(checker, nullptr);
  for (void* p : live) free(p);
  std::sort(g_checks_ahead, g_checks_ahead + 20);
  fprintf(stderr, "debug-check-loop: checks gone ahead of a fork: median %ld, most %ld (20 forks, %ld checks in all)\n",
         g_checks_ahead[10], g_checks_ahead[19], g_checks.load());
  if (g_checks_ahead[10] > 20) Fail("fork waited behind a loop of heap checks");
  return 0;
}

// ---- debug-idle: the background thread empties idle quarantine shards while the main thread forks
// Bursts of debug frees with pauses longer than BRISK_IDLE_MS (10 ms under ctest), so that the
// background thread keeps finding idle shards and takes their blocks out (debug/block.cc's
// leave_idle_quarantine, through the background pass) while fork's prepare handler takes the
// debug layer's locks, then the pass lock. The lock order itself is checked step by step in
// fork_heap_lock_test (ForkWhileTheBackgroundPassEmptiesIdleQuarantineShards); this runs the
// whole process under load: children of a parent whose background thread empties shards.
void* DebugBurstFreer(void* arg) {
  unsigned seed = static_cast<unsigned>(reinterpret_cast<uintptr_t>(arg));
  while (!g_stop.load(std::memory_order_relaxed)) {
    void* blocks[64];
    for (void*& b : blocks) {
      b = malloc(50 + rand_r(&seed) % 3000);
      if (b == nullptr) Fail("debug malloc");
    }
    for (void* b : blocks) free(b);
    usleep(rand_r(&seed) % 15000);
  }
  return nullptr;
}

int DebugIdleFork() {
  auto active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "brisk_debug_active"));
  if (active == nullptr) Fail("brisk is not loaded");
  if (active() == 0) Fail("run with BRISK_DEBUG=1 and BRISK_IDLE_MS=10");
  ArmWatchdog(120);
  pthread_t threads[] = {Spawn(DebugBurstFreer, reinterpret_cast<void*>(1)), Spawn(DebugBurstFreer, reinterpret_cast<void*>(2)),
                         Spawn(DebugBurstFreer, reinterpret_cast<void*>(3))};
  ForkWhileThreadsRun(150, AllocateEverything, threads);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fork_test malloc-fork-deadlock|mallocfork2|mallocfork|mallocfork3|stdio|exit|locks|debug|debug-check-loop|debug-idle\n");
    return 2;
  }
  g_case = argv[1];
  g_main_pid = getpid();
  struct {
    const char* name;
    int (*run)();
  } cases[] = {{"malloc-fork-deadlock", MallocForkDeadlock}, {"mallocfork2", MallocFork2},
               {"mallocfork", MallocForkNested},          {"mallocfork3", MallocFork3},
               {"stdio", StdioFork},                      {"exit", ExitFork},
               {"locks", LocksBusyFork},                  {"debug", DebugBusyFork},
               {"debug-check-loop", DebugCheckLoopFork},  {"debug-idle", DebugIdleFork}};
  for (const auto& c : cases)
    if (strcmp(c.name, g_case) == 0) return c.run();
  fprintf(stderr, "fork_test: unknown case %s\n", g_case);
  return 2;
}
