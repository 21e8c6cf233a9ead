// glibc's fork protocol (see platform_fork.h for the contract).
#include "core/platform_fork.h"

#include <pthread.h>

// glibc exports these (the _IO_list_* since 2.2.5, __register_atfork since 2.3.2,
// __libc_single_threaded since 2.32). Weak, so that brisk still loads under a libc without them.
extern "C" {
extern char __libc_single_threaded;
void _IO_list_lock();
void _IO_list_unlock();
void _IO_list_resetlock();
int __register_atfork(void (*prepare)(), void (*parent)(), void (*child)(), void* dso_handle);
}
#pragma weak __libc_single_threaded
#pragma weak _IO_list_lock
#pragma weak _IO_list_unlock
#pragma weak _IO_list_resetlock
#pragma weak __register_atfork

namespace brisk::platform {

bool single_threaded() {
  return &__libc_single_threaded != nullptr &&
         __atomic_load_n(&__libc_single_threaded, __ATOMIC_RELAXED) != 0;
}

bool stdio_list_lock() {
  if (_IO_list_lock == nullptr || _IO_list_unlock == nullptr || _IO_list_resetlock == nullptr)
    return false;
  _IO_list_lock();
  return true;
}

void stdio_list_unlock() { _IO_list_unlock(); }

// glibc has already reset the lock when the process was multithreaded (and we take it only
// then); resetting it again is harmless, and right for a libc that had not.
void stdio_list_reset_in_child() { _IO_list_resetlock(); }

void register_fork_handlers(void (*prepare)(), void (*parent)(), void (*child)()) {
  if (__register_atfork != nullptr) {
    __register_atfork(prepare, parent, child, nullptr);
  } else {
    pthread_atfork(prepare, parent, child);
  }
}

void block_signals(sigset_t* old) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, old);
}

void restore_signals(const sigset_t* old) { pthread_sigmask(SIG_SETMASK, old, nullptr); }

}  // namespace brisk::platform
