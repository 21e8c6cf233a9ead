// Linux implementation of platform_stop.h: a ptrace helper process that shares the address
// space, as LeakSanitizer's StopTheWorld does (the idea; the code is brisk's).
//
// The helper ("tracer") is made with clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED)
// and no exit signal: it is a child process, not a thread, so it may ptrace every thread of this
// one, and it shares this process's memory, so it writes the registers and the outcome straight
// into a Control block here. It runs with every signal blocked (a copy of the program's handlers
// must not run in it) and shares the calling thread's TLS (no CLONE_SETTLS), so it calls no C
// library function: its system calls are made inline (raw_syscall), which return -errno and
// leave errno, the caller's, alone while the caller waits in system calls of its own. Yama's
// ptrace_scope 1 lets a process trace only its descendants: the tracer is a child, not an
// ancestor, so the caller names it with PR_SET_PTRACER first (only then: yama_names_tracers).
// Each listing of /proc/self/task seizes and interrupts every thread new in it before waiting
// for any, so they stop side by side, under one deadline.
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
// The threads of one listing, interrupted together, are waited for this long (one in
// uninterruptible sleep stops when it leaves it, normally within milliseconds; one in vfork
// does not stop until its child execs or exits); then the stop fails.
constexpr long kStopTimeoutNs = 2'000'000'000;
constexpr int kNtPrstatus = 1;  // <elf.h>'s NT_PRSTATUS
// The vector registers, where a compiler's code may hold a pointer for a while (a 16-byte
// struct copied through xmm, a vectorised loop over pointers): x86-64's XSAVE area in its
// standard layout (NT_X86_XSTATE), read up to the end of AVX-512's upper sixteen zmm registers
// at byte 2688 (the legacy area's xmm0-15, then the upper halves of ymm0-15, then of zmm0-15,
// then zmm16-31; AMX's tiles, past it, are not read); the kernel writes the components the
// CPU has and stops at the buffer's end. Where there is no XSAVE (and on AArch64, whose v0-v31
// are 528 bytes), NT_PRFPREG's set. The words read are roots like the general registers: the
// control words among them can only keep a block, never drop one.
constexpr std::size_t kVectorWords = 2688 / sizeof(std::uintptr_t);
constexpr int kNtPrfpreg = 2;  // <elf.h>'s NT_PRFPREG
constexpr int kNtX86Xstate = 0x202;  // <elf.h>'s NT_X86_XSTATE

enum State : int { kStarting, kAttach, kStopped, kFailed, kResume, kDone };
enum Failure : int { kNone, kAttachFailed, kTimeout, kTooMany, kTaskList, kRegisters };

struct Control {
  std::atomic<int> state;
  int task_fd;  // /proc/self/task of the process, opened by the caller
  int caller;   // its thread that stops the others, not stopped
  int failure;  // a Failure, when state is kFailed
  int failure_errno;
  int failure_tid;
  std::size_t count;  // threads attached and stopped, in tids
  int tids[kMaxStopped];
  std::uintptr_t registers[kMaxStopped][kRegisterWords];  // each thread's NT_PRSTATUS set
  std::uintptr_t vectors[kMaxStopped][kVectorWords];      // and its vector registers (above)
};

struct World {
  Control* control = nullptr;
  char* stack = nullptr;
  int tracer = -1;
  bool ptracer_named = false;  // PR_SET_PTRACER set for the tracer, to be undone
  char failure[160] = "";
};
World g_world;  // one caller at a time (platform_stop.h)

// The tracer's code: no sanitizer instrumentation (its shadow state and fake stacks belong to
// the calling thread, whose TLS the tracer shares).
#define BRISK_TRACER __attribute__((no_sanitize("address", "undefined"), noinline))

// A system call made inline: the result, or -errno. Not under ThreadSanitizer, whose runtime
// owns the threads: there, and on other architectures, only the stubs below are built.
#if defined(__SANITIZE_THREAD__)
#define BRISK_STOP_SUPPORTED 0
#elif defined(__x86_64__)
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
#endif

#if BRISK_STOP_SUPPORTED

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

// Whether the thread of /proc/self/task/<name> has exited (zombie or dead): the main thread
// after pthread_exit stays listed as a zombie until the process ends, and the kernel refuses to
// seize it (EPERM). Its stack stays mapped, a root like any other.
BRISK_TRACER bool exited(const Control* c, const char* name) {
  char path[32];
  int n = 0;
  for (const char* p = name; *p != '\0' && n < 20; ++p) path[n++] = *p;
  for (const char* p = "/stat"; *p != '\0'; ++p) path[n++] = *p;
  path[n] = '\0';
  const long fd = sys(SYS_openat, c->task_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fd == -ENOENT;  // gone meanwhile
  char text[512];
  const long got = sys(SYS_read, fd, text, sizeof text);
  sys(SYS_close, fd);
  // "tid (comm) S ...": comm may hold anything, so the state is read after the last ')'.
  long close_paren = -1;
  for (long k = 0; k < got; ++k)
    if (text[k] == ')') close_paren = k;
  return close_paren >= 0 && close_paren + 2 < got && (text[close_paren + 2] == 'Z' || text[close_paren + 2] == 'X');
}

// Seizes tid (with PTRACE_SEIZE no SIGSTOP is queued that could outlive the tracer) and
// interrupts it: 1 on its way to its interrupt stop, 0 gone, -1 failed (recorded in c).
BRISK_TRACER int seize(Control* c, int tid, const char* name) {
  long r = sys(SYS_ptrace, PTRACE_SEIZE, tid, 0, 0);
  if (r == -EPERM && exited(c, name)) return 0;
  if (r == 0) r = sys(SYS_ptrace, PTRACE_INTERRUPT, tid, 0, 0);
  if (r == -ESRCH) return 0;
  if (r != 0) {
    fail(c, kAttachFailed, tid, static_cast<int>(-r));
    return -1;
  }
  return 1;
}

// Waits for a seized and interrupted tid's stop until deadline (ns): 1 stopped, 0 gone, -1
// failed. A signal arriving first stops it for the tracer (signal-delivery-stop): it goes on to
// the thread, and the interrupt's stop follows.
BRISK_TRACER int wait_stopped(Control* c, int tid, long deadline) {
  for (;;) {
    int status = 0;
    const long r = sys(SYS_wait4, tid, &status, __WALL | WNOHANG, 0);
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

// Seizes and interrupts every listed thread not yet in c->tids, then waits for all of them
// (one deadline for the pass: they stop side by side); -1 failed, else how many were new.
BRISK_TRACER int attach_listed(Control* c) {
  const std::size_t first = c->count;
  sys(SYS_lseek, c->task_fd, 0, SEEK_SET);
  alignas(8) char buffer[32768];
  for (;;) {
    const long n = sys(SYS_getdents64, c->task_fd, buffer, sizeof buffer);
    if (n < 0) {
      fail(c, kTaskList, 0, static_cast<int>(-n));
      return -1;
    }
    if (n == 0) break;
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
        return -1;
      }
      const int r = seize(c, tid, name);
      if (r < 0) return -1;
      if (r == 1) c->tids[c->count++] = tid;
    }
  }
  const long deadline = now_ns() + kStopTimeoutNs;
  std::size_t kept = first;
  for (std::size_t i = first; i < c->count; ++i) {
    const int r = wait_stopped(c, c->tids[i], deadline);
    if (r < 0) {
      c->count = kept;  // those stopped so far, for detach_all
      return -1;
    }
    if (r == 1) c->tids[kept++] = c->tids[i];
  }
  c->count = kept;
  return static_cast<int>(kept - first);
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
      break;
    }
    // Not a failure when neither set reads (a CPU without the state): the general registers
    // are the ones every pointer passes through.
    iovec vio{c->vectors[i], sizeof c->vectors[i]};
    if (sys(SYS_ptrace, PTRACE_GETREGSET, c->tids[i], kNtX86Xstate, &vio) != 0) {
      vio = iovec{c->vectors[i], sizeof c->vectors[i]};
      sys(SYS_ptrace, PTRACE_GETREGSET, c->tids[i], kNtPrfpreg, &vio);
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

// Whether Yama's ptrace_scope is 1, which lets a process trace only its descendants and those
// that named it with PR_SET_PTRACER. Only then is the tracer named: the call replaces the
// program's own choice (a crash handler's PR_SET_PTRACER_ANY, say), which cannot be read back,
// and undoing it leaves none.
bool yama_names_tracers() {
  const int fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, "/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC));
  if (fd < 0) return false;
  char scope = 0;
  const long n = syscall(SYS_read, fd, &scope, 1);
  syscall(SYS_close, fd);
  return n == 1 && scope == '1';
}

void release_world() {
  World& w = g_world;
  if (w.ptracer_named) syscall(SYS_prctl, PR_SET_PTRACER, 0, 0, 0, 0);
  w.ptracer_named = false;
  if (w.control != nullptr && w.control->task_fd >= 0) syscall(SYS_close, w.control->task_fd);
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
    case kTimeout: t.text("a thread did not stop within 2 s (one in vfork, say): "); break;
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

#endif  // BRISK_STOP_SUPPORTED

}  // namespace

bool stop_other_threads() {
#if !BRISK_STOP_SUPPORTED
  TextWriter t(g_world.failure, sizeof g_world.failure);
  t.text("threads cannot be stopped in this build (ThreadSanitizer's, or not x86-64 or AArch64)");
  t.finish();
  return false;
#else
  World& w = g_world;
  w.failure[0] = '\0';
  const int saved_errno = errno;
  // Each failure before the tracer runs: why, and nothing left (release_world undoes what was made).
  auto give_up = [&](const char* why, int error) {
    TextWriter t(w.failure, sizeof w.failure);
    t.text(why);
    if (error != 0) {
      t.text(" (errno ");
      t.decimal(static_cast<std::uint64_t>(error));
      t.text(")");
    }
    t.finish();
    release_world();
    errno = saved_errno;
    return false;
  };
  void* control = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (control == MAP_FAILED) return give_up("no memory for the stop", 0);
  w.control = static_cast<Control*>(control);
  Control* c = w.control;
  c->task_fd = -1;  // for release_world: the mapping reads 0, a descriptor
  void* stack = mmap(nullptr, kTracerStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (stack == MAP_FAILED) return give_up("no memory for the stop", 0);
  w.stack = static_cast<char*>(stack);
  c->caller = static_cast<int>(syscall(SYS_gettid));
  // Opened here, not by the tracer: /proc/self is this process, whatever pid namespace /proc
  // belongs to. Shared with the tracer (CLONE_FILES).
  c->task_fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (c->task_fd < 0) return give_up("the thread list could not be read (/proc/self/task)", errno);
  c->state.store(kStarting, std::memory_order_relaxed);
  // The tracer starts with every signal blocked (inherited), before it could take one.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  w.tracer = clone(tracer_main, w.stack + kTracerStack, CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED, c);
  const int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (w.tracer < 0) return give_up("the stop's helper process could not be made", clone_errno);
  w.ptracer_named = yama_names_tracers() && syscall(SYS_prctl, PR_SET_PTRACER, w.tracer, 0, 0, 0) == 0;
  set_state(c, kAttach);
  // The tracer bounds each pass's wait (kStopTimeoutNs); were it to die (killed), its wait
  // status tells, or ECHILD if another thread of the program reaped it (wait with __WALL).
  for (;;) {
    const int state = c->state.load(std::memory_order_acquire);
    if (state == kStopped || state == kFailed) break;
    const timespec tick{0, 10'000'000};
    futex(&c->state, FUTEX_WAIT_PRIVATE, state, &tick);
    int status;
    if (c->state.load(std::memory_order_acquire) != kAttach) continue;
    const long r = syscall(SYS_wait4, w.tracer, &status, __WALL | WNOHANG, nullptr);
    if (r == w.tracer || (r < 0 && errno == ECHILD)) {
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
#if BRISK_STOP_SUPPORTED
  World& w = g_world;
  if (w.control == nullptr) return;
  const int saved_errno = errno;
  set_state(w.control, kResume);
  reap(w.tracer);
  release_world();
  errno = saved_errno;
#endif
}

std::size_t stopped_thread_count() { return g_world.control != nullptr ? g_world.control->count : 0; }
const char* stop_failure() { return g_world.failure; }

}  // namespace brisk::platform
