// Every other thread of the process stopped, for a scan of its memory (the debug layer's leak
// report at exit, debug/leaks.cc), the way LeakSanitizer stops the world: a helper process that
// shares the address space (clone with CLONE_VM, not a thread of this process) attaches to each
// thread with ptrace (PTRACE_SEIZE, then PTRACE_INTERRUPT, which sends no signal the program
// could see) and copies its registers into memory of this process, so that a pointer held only
// in a stopped thread's register is read by the scan like any other word. A thread that blocks
// every signal stops too (a signal-based stop, the Boehm collector's, would wait on it for ever),
// and so does one in a system call, whose registers are in the kernel.
//
// Contract: stop_other_threads() returns true with every other thread of the process stopped
// (threads started meanwhile included) and their registers in a private writable mapping of
// this process (a root of the mark: /proc/self/maps lists it); resume_other_threads() lets them
// all run again, and must follow. While they are stopped the caller must not take a lock another
// thread may hold, nor allocate. On false no thread is left stopped and failure() says why in
// words for a report: ptrace refused (a debugger or strace already traces the process, a
// non-dumpable process, Yama's ptrace_scope 2 or 3, a seccomp filter), a thread that did not stop
// within 2 s, more threads than kMaxStopped, or a ThreadSanitizer build. One caller at a time;
// nothing here allocates.
#pragma once

#include <cstddef>

namespace brisk::platform {

constexpr std::size_t kMaxStopped = 8192;

bool stop_other_threads();
void resume_other_threads();
std::size_t stopped_thread_count();  // after a stop_other_threads() that returned true
const char* stop_failure();          // after one that returned false

}  // namespace brisk::platform
