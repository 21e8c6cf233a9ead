// Linux implementation of platform_stop.h: a ptrace helper process that shares the address
// space, as LeakSanitizer's StopTheWorld does (the idea; the code is brisk's).
//
// The helper ("tracer") is made with clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED)
// and no exit signal: it is a child process, not a thread, so it may ptrace every thread of this
// one, and it shares this process's memory, so it writes the registers and the outcome straight
// into a Control block here. It runs with every signal blocked (a copy of the program's handlers
// must not run in it) and shares the calling thread's TLS (no CLONE_SETTLS), so it calls no C
// library function: its system calls are made inline (raw_syscall), which return -errno and
// leave errno, the caller's, alone while the caller waits in system calls of its own. Yama's ptrace_scope 1
// lets a process trace only its descendants: the tracer is a child, not an ancestor, so the
// caller names it with PR_SET_PTRACER first.
//
// The handshake is one word, Control::state, waited on with a private futex (both processes
// share the mm, which is what a private futex is keyed on):
//   caller: kStarting -> (PR_SET_PTRACER) kAttach
//   tracer: kAttach -> kStopped (every other thread stopped, registers copied) or kFailed
//   caller: kStopped -> kResume (after the scan)
//   tracer: kResume -> (every thread detached) kDone, and exits; the caller reaps it.
#include "core/platform_stop.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "core/text_writer.h"

namespace brisk::platform {
namespace {

// NT_PRSTATUS's register set: 27 words on x86-64, 34 on AArch64; the kernel writes at most this.
constexpr std::size_t kRegisterWords = 64;
constexpr std::size_t kTracerStack = 256 * 1024;
// A thread that has not stopped this long after PTRACE_INTERRUPT is given up on (one in
// uninterruptible sleep stops when it leaves it, normally within milliseconds).
constexpr long kStopTimeoutNs = 2'000'000'000;
constexpr int kNtPrstatus = 1;  // <elf.h>'s NT_PRSTATUS

enum State : int { kStarting, kAttach, kStopped, kFailed, kResume, kDone };
enum Failure : int { kNone, kAttachFailed, kTimeout, kTooMany, kTaskList, kRegisters };

struct Control {
  std::atomic<int> state;
  int pid;      // the process whose threads are stopped
  char task_path[32];  // "/proc/<pid>/task"
  int caller;   // its thread that stops the others, not stopped
  int failure;  // a Failure, when state is kFailed
  int failure_errno;
  int failure_tid;
  std::size_t count;  // threads attached and stopped, in tids
  int tids[kMaxStopped];
  std::uintptr_t registers[kMaxStopped][kRegisterWords];  // each thread's NT_PRSTATUS set
};

struct World {
  Control* control = nullptr;
  char* stack = nullptr;
  int tracer = -1;
  char failure[160] = "";
};
World g_world;  // one caller at a time (platform_stop.h)

// The tracer's code: no sanitizer instrumentation (its shadow state and fake stacks belong to
// the calling thread, whose TLS the tracer shares).
#define BRISK_TRACER __attribute__((no_sanitize("address", "undefined"), noinline))

// A system call made inline: the result, or -errno.
#if defined(__x86_64__)
#define BRISK_STOP_SUPPORTED 1
BRISK_TRACER long raw_syscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  long result;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  asm volatile("syscall" : "=a"(result) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
  return result;
}
#elif defined(__aarch64__)
#define BRISK_STOP_SUPPORTED 1
BRISK_TRACER long raw_syscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  register long x8 asm("x8") = n;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  register long x4 asm("x4") = e;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
  return x0;
}
#else
#define BRISK_STOP_SUPPORTED 0
BRISK_TRACER long raw_syscall(long, long = 0, long = 0, long = 0, long = 0, long = 0) { return -ENOSYS; }
#endif

template <typename A, typename B = long, typename C = long, typename D = long>
BRISK_TRACER long sys(long n, A a, B b = 0, C c = 0, D d = 0) {
  return raw_syscall(n, (long)a, (long)b, (long)c, (long)d);
}

BRISK_TRACER long futex(std::atomic<int>* word, int op, int value, const timespec* timeout) {
  return sys(SYS_futex, reinterpret_cast<int*>(word), op, value, timeout);
}

BRISK_TRACER long now_ns() {
  timespec ts{};
  sys(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000L + ts.tv_nsec;
}

BRISK_TRACER void pause_us(long us) {
  timespec ts{0, us * 1000};
  sys(SYS_nanosleep, &ts, nullptr);
}

BRISK_TRACER void fail(Control* c, int failure, int tid, int error) {
  c->failure = failure;
  c->failure_tid = tid;
  c->failure_errno = error;
}

// Whether tid stops: attached (seized, so no SIGSTOP is queued that could outlive the tracer),
// interrupted, and waited for until its interrupt stop. A signal arriving first stops it for the
// tracer (signal-delivery-stop): it goes on to the thread, and the interrupt's stop follows.
// 1 stopped, 0 gone (exited meanwhile), -1 failed (recorded in c).
BRISK_TRACER int attach(Control* c, int tid) {
  long r = sys(SYS_ptrace, PTRACE_SEIZE, tid, 0, 0);
  if (r == 0) r = sys(SYS_ptrace, PTRACE_INTERRUPT, tid, 0, 0);
  if (r != 0) {
    if (r == -ESRCH) return 0;
    fail(c, kAttachFailed, tid, static_cast<int>(-r));
    return -1;
  }
  const long deadline = now_ns() + kStopTimeoutNs;
  for (;;) {
    int status = 0;
    r = sys(SYS_wait4, tid, &status, __WALL | WNOHANG, 0);
    if (r < 0) {
      if (r == -EINTR) continue;
      return 0;  // ECHILD: it exited and was reaped
    }
    if (r == 0) {
      if (now_ns() > deadline) {
        fail(c, kTimeout, tid, 0);
        return -1;  // still seized: the tracer's exit detaches it
      }
      pause_us(50);
      continue;
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) return 0;
    if (!WIFSTOPPED(status)) continue;
    if ((status >> 16) == PTRACE_EVENT_STOP) return 1;
    sys(SYS_ptrace, PTRACE_CONT, tid, 0, WSTOPSIG(status));
  }
}

BRISK_TRACER bool attached(const Control* c, int tid) {
  for (std::size_t i = 0; i < c->count; ++i)
    if (c->tids[i] == tid) return true;
  return false;
}

// Attaches every thread of the process not yet attached; -1 failed, else how many were new.
BRISK_TRACER int attach_listed(Control* c) {
  const long fd = sys(SYS_openat, AT_FDCWD, c->task_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    fail(c, kTaskList, 0, static_cast<int>(-fd));
    return -1;
  }
  int added = 0;
  alignas(8) char buffer[4096];
  for (;;) {
    const long n = sys(SYS_getdents64, fd, buffer, sizeof buffer);
    if (n <= 0) {
      if (n < 0) {
        fail(c, kTaskList, 0, static_cast<int>(-n));
        added = -1;
      }
      break;
    }
    for (long at = 0; at < n;) {
      // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
      const long reclen = static_cast<unsigned char>(buffer[at + 16]) | static_cast<unsigned char>(buffer[at + 17]) << 8;
      const char* name = buffer + at + 19;
      at += reclen;
      if (name[0] < '0' || name[0] > '9') continue;  // "." and ".."
      int tid = 0;
      for (const char* p = name; *p >= '0' && *p <= '9'; ++p) tid = tid * 10 + (*p - '0');
      if (tid == c->caller || attached(c, tid)) continue;
      if (c->count == kMaxStopped) {
        fail(c, kTooMany, 0, 0);
        added = -1;
        break;
      }
      const int r = attach(c, tid);
      if (r < 0) {
        added = -1;
        break;
      }
      if (r == 1) {
        c->tids[c->count++] = tid;
        ++added;
      }
    }
    if (added < 0) break;
  }
  sys(SYS_close, fd);
  return added;
}

BRISK_TRACER void detach_all(Control* c) {
  for (std::size_t i = 0; i < c->count; ++i) sys(SYS_ptrace, PTRACE_DETACH, c->tids[i], 0, 0);
}

BRISK_TRACER void set_state(Control* c, int state) {
  c->state.store(state, std::memory_order_release);
  futex(&c->state, FUTEX_WAKE_PRIVATE, 1, nullptr);
}

// The tracer. Threads started while it attaches are found by listing again, until a listing
// finds none new (a stopped thread starts none).
BRISK_TRACER int tracer_main(void* argument) {
  auto* c = static_cast<Control*>(argument);
  sys(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);  // never outlive the caller
  while (c->state.load(std::memory_order_acquire) == kStarting) futex(&c->state, FUTEX_WAIT_PRIVATE, kStarting, nullptr);
  int added;
  do {
    added = attach_listed(c);
  } while (added > 0);
  for (std::size_t i = 0; added == 0 && i < c->count; ++i) {
    iovec io{c->registers[i], sizeof c->registers[i]};
    if (const long r = sys(SYS_ptrace, PTRACE_GETREGSET, c->tids[i], kNtPrstatus, &io); r != 0) {
      fail(c, kRegisters, c->tids[i], static_cast<int>(-r));
      added = -1;
    }
  }
  if (added < 0) {
    detach_all(c);
    set_state(c, kFailed);
    return 0;
  }
  set_state(c, kStopped);
  while (c->state.load(std::memory_order_acquire) == kStopped) futex(&c->state, FUTEX_WAIT_PRIVATE, kStopped, nullptr);
  detach_all(c);
  set_state(c, kDone);
  return 0;
}

void reap(int tracer) {
  int status;
  while (syscall(SYS_wait4, tracer, &status, __WALL, nullptr) < 0 && errno == EINTR) {
  }
}

void release_world() {
  World& w = g_world;
  syscall(SYS_prctl, PR_SET_PTRACER, 0, 0, 0, 0);
  if (w.control != nullptr) munmap(w.control, sizeof(Control));
  if (w.stack != nullptr) munmap(w.stack, kTracerStack);
  w.control = nullptr;
  w.stack = nullptr;
  w.tracer = -1;
}

void describe_failure(const Control* c) {
  TextWriter t(g_world.failure, sizeof g_world.failure);
  switch (c->failure) {
    case kAttachFailed: t.text("ptrace could not stop thread "); break;
    case kTimeout: t.text("this thread did not stop within 2 s: "); break;
    case kTooMany: t.text("more threads than the stop holds"); break;
    case kTaskList: t.text("the thread list could not be read"); break;
    case kRegisters: t.text("the registers could not be read of thread "); break;
    default: t.text("the stop's helper process ended early"); break;
  }
  if (c->failure_tid != 0) t.decimal(static_cast<std::uint64_t>(c->failure_tid));
  if (c->failure_errno != 0) {
    t.text(" (errno ");
    t.decimal(static_cast<std::uint64_t>(c->failure_errno));
    t.text(c->failure_errno == EPERM ? ": not permitted; is the process traced already?)" : ")");
  }
  t.finish();
}

void set_failure(const char* text) {
  TextWriter t(g_world.failure, sizeof g_world.failure);
  t.text(text);
  t.finish();
}

}  // namespace

bool stop_other_threads() {
#if defined(__SANITIZE_THREAD__) || !BRISK_STOP_SUPPORTED
  set_failure("threads cannot be stopped in this build (ThreadSanitizer's, or not x86-64 or AArch64)");
  return false;
#else
  World& w = g_world;
  w.failure[0] = '\0';
  const int saved_errno = errno;
  void* control = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* stack = mmap(nullptr, kTracerStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (control == MAP_FAILED || stack == MAP_FAILED) {
    if (control != MAP_FAILED) munmap(control, sizeof(Control));
    if (stack != MAP_FAILED) munmap(stack, kTracerStack);
    set_failure("no memory for the stop");
    errno = saved_errno;
    return false;
  }
  w.control = static_cast<Control*>(control);
  w.stack = static_cast<char*>(stack);
  Control* c = w.control;
  c->pid = static_cast<int>(syscall(SYS_getpid));
  c->caller = static_cast<int>(syscall(SYS_gettid));
  TextWriter path(c->task_path, sizeof c->task_path);
  path.text("/proc/");
  path.decimal(static_cast<std::uint64_t>(c->pid));
  path.text("/task");
  path.finish();
  c->state.store(kStarting, std::memory_order_relaxed);
  // The tracer starts with every signal blocked (inherited), before it could take one.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  w.tracer = clone(tracer_main, w.stack + kTracerStack, CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED, c);
  const int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (w.tracer < 0) {
    TextWriter t(w.failure, sizeof w.failure);
    t.text("the stop's helper process could not be made (errno ");
    t.decimal(static_cast<std::uint64_t>(clone_errno));
    t.text(")");
    t.finish();
    release_world();
    errno = saved_errno;
    return false;
  }
  syscall(SYS_prctl, PR_SET_PTRACER, w.tracer, 0, 0, 0);  // EINVAL without Yama: nothing to do
  set_state(c, kAttach);
  // The tracer bounds each thread's stop (kStopTimeoutNs); were it to die (killed), its wait
  // status tells.
  for (;;) {
    const int state = c->state.load(std::memory_order_acquire);
    if (state == kStopped || state == kFailed) break;
    const timespec tick{0, 10'000'000};
    futex(&c->state, FUTEX_WAIT_PRIVATE, state, &tick);
    int status;
    if (c->state.load(std::memory_order_acquire) == kAttach &&
        syscall(SYS_wait4, w.tracer, &status, __WALL | WNOHANG, nullptr) == w.tracer) {
      w.tracer = -1;
      fail(c, kNone, 0, 0);
      c->state.store(kFailed, std::memory_order_relaxed);
    }
  }
  if (c->state.load(std::memory_order_relaxed) == kFailed) {
    describe_failure(c);
    if (w.tracer >= 0) reap(w.tracer);
    release_world();
    errno = saved_errno;
    return false;
  }
  errno = saved_errno;
  return true;
#endif
}

void resume_other_threads() {
  World& w = g_world;
  if (w.control == nullptr) return;
  const int saved_errno = errno;
  set_state(w.control, kResume);
  reap(w.tracer);
  release_world();
  errno = saved_errno;
}

std::size_t stopped_thread_count() { return g_world.control != nullptr ? g_world.control->count : 0; }
const char* stop_failure() { return g_world.failure; }

}  // namespace brisk::platform
