// The C library's side of fork, for brisk's atfork handlers (threadcache/heap_lifecycle.cc).
//
// What glibc's fork does (2.34 to 2.36, posix/fork.c; checked against Debian 12's 2.36 by
// disassembly): it reads __libc_single_threaded once, runs the prepare handlers, and only if the
// process is multithreaded takes the NSS database lock, _IO_list_lock (the list of stdio
// streams) and then its own malloc's locks. In the child it resets those locks, and the lock of
// every stream, before the child handlers run; in the parent it releases them before the parent
// handlers run.
//
// Contract: the C library's symbols are looked up weakly, so a libc without them still loads
// brisk; then single_threaded() says false and stdio_list_lock() takes nothing. Nothing here
// allocates or touches brisk's state. stdio_list_lock() may block: call it holding no brisk lock.
#pragma once

#include <signal.h>

namespace brisk::platform {

// True only if the C library says the process has one thread, the same test glibc's fork makes.
bool single_threaded();

// Takes the C library's stdio list lock, which is recursive, if the library has one: false if
// it has not. Undo with stdio_list_unlock() in the parent, stdio_list_reset_in_child() in the
// child.
bool stdio_list_lock();
void stdio_list_unlock();
void stdio_list_reset_in_child();

// pthread_atfork, except that exit() cannot unregister the handlers. pthread_atfork ties them to
// the calling library, and glibc drops a library's handlers while exit() runs its destructors;
// a fork in another thread between its prepare and parent handlers then never releases what
// prepare took. glibc's __register_atfork with no library keeps them; without it, pthread_atfork.
void register_fork_handlers(void (*prepare)(), void (*parent)(), void (*child)());

// Blocks every signal that can be blocked on this thread; the old mask goes to *old.
void block_signals(sigset_t* old);
void restore_signals(const sigset_t* old);

}  // namespace brisk::platform
