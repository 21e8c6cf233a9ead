// Every other thread of the process stopped, for a scan of its memory (the debug layer's leak
// report at exit, debug/leaks.cc), the way LeakSanitizer stops the world: a helper process that
// shares the address space (clone with CLONE_VM, not a thread of this process) attaches to each
// thread with ptrace (PTRACE_SEIZE, then PTRACE_INTERRUPT) and copies its registers into memory
// of this process, so that a pointer held only in a stopped thread's register is read by the
// scan like any other word (the general-purpose ones, NT_PRSTATUS, and the vector ones, up to
// AVX-512's on x86-64). A thread that blocks every signal stops too (a signal-based stop,
// the Boehm collector's, would wait on it for ever), and so does one in a system call, whose
// registers are in the kernel. The program sees no signal, but as under a debugger a few
// blocking calls of a stopped thread return EINTR (epoll_wait, sigwaitinfo, semop, ...: see
// signal(7)); calls restarted after a signal handler are restarted here too.
//
// Contract: stop_other_threads() returns true with every other thread of the process stopped
// (threads started meanwhile included) and their registers in a private writable mapping of
// this process (a root of the mark: /proc/self/maps lists it); resume_other_threads() lets them
// all run again, and must follow. While they are stopped the caller must not take a lock another
// thread may hold, nor allocate: take such locks before the stop (a thread waiting for one is
// stopped in its wait). On false no thread is left stopped and stop_failure() says why in words
// for a report: ptrace refused (a debugger or strace already traces the process, a non-dumpable
// process, Yama's ptrace_scope 2 or 3, a seccomp filter), a thread that did not stop within 2 s
// (one in vfork), more threads than kMaxStopped, or a ThreadSanitizer build. Threads that have
// exited but are still listed (a main thread after pthread_exit, a zombie) are left out. One
// caller at a time; nothing here allocates.
#pragma once

#include <cstddef>

namespace brisk::platform {

constexpr std::size_t kMaxStopped = 8192;

bool stop_other_threads();
void resume_other_threads();
std::size_t stopped_thread_count();  // after a stop_other_threads() that returned true
const char* stop_failure();          // after one that returned false

}  // namespace brisk::platform
