// Linux implementation of the platform layer (see platform.h for the contract).
#include "core/platform.h"

#include <errno.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/assert.h"
#include "core/config.h"
#include "core/hints.h"
#include "core/stats.h"

extern char** environ;

namespace brisk::platform {
namespace {

std::atomic<long> g_map_failure_after{-1};

// open, close, read, pread, write, nanosleep and getrandom go through syscall(2), which is no
// cancellation point: glibc's wrappers are, and a thread with a cancellation pending (deferred,
// the default) was unwound from inside brisk, which is built without exceptions, so no
// destructor ran: a calloc of a reused block reads /proc/self/pagemap (zero_pages) and left its
// block neither handed out nor free, and on the large stash's path its heap's lock held, on which
// the next fork then hung in atfork_prepare. POSIX allows no cancellation point in malloc's
// functions. Same results and errno as the wrappers.
int open_nc(const char* path, int flags, mode_t mode = 0) {
  return static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags, mode));
}
void close_nc(int fd) { syscall(SYS_close, fd); }
ssize_t read_nc(int fd, void* buf, std::size_t n) { return static_cast<ssize_t>(syscall(SYS_read, fd, buf, n)); }
ssize_t pread_nc(int fd, void* buf, std::size_t n, off_t offset) {
  return static_cast<ssize_t>(syscall(SYS_pread64, fd, buf, n, offset));
}
ssize_t write_nc(int fd, const void* buf, std::size_t n) { return static_cast<ssize_t>(syscall(SYS_write, fd, buf, n)); }

bool injected_failure() {
  long n = g_map_failure_after.load(std::memory_order_relaxed);
  if (n < 0) return false;
  if (n == 0) return true;
  g_map_failure_after.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

// Without MAP_NORESERVE: under the kernel's default overcommit heuristic (vm.overcommit_memory
// 0) a mapping larger than RAM and swap together is then refused, so malloc(16 TiB) returns NULL
// with ENOMEM as glibc's does, instead of a pointer the first touch of which summons the OOM
// killer. The heuristic refuses nothing a machine could back; under strict accounting (2) the
// flag is ignored anyway, and under 1 every mapping goes through.
void* raw_map(std::size_t size) {
  if (injected_failure()) return nullptr;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  stats::g.os_map_calls.fetch_add(1, std::memory_order_relaxed);
  return p;
}

}  // namespace

void set_map_failure_after(long n) { g_map_failure_after.store(n, std::memory_order_relaxed); }

void* map(std::size_t size) {
  BRISK_ASSERT(size % kOsPageSize == 0);
  return raw_map(size);
}

void* map_aligned(std::size_t size, std::size_t alignment) {
  BRISK_ASSERT(size % kOsPageSize == 0 && alignment >= kOsPageSize && (alignment & (alignment - 1)) == 0);
  // Over-reserve by the alignment and trim both ends: two extra munmaps, but the kernel gives no
  // aligned mmap. Callers cache what they map (chunk cache, large cache) to keep this rare.
  if (size + alignment < size) return nullptr;
  char* raw = static_cast<char*>(raw_map(size + alignment));
  if (raw == nullptr) return nullptr;
  std::uintptr_t a = (reinterpret_cast<std::uintptr_t>(raw) + alignment - 1) & ~(alignment - 1);
  char* aligned = reinterpret_cast<char*>(a);
  std::size_t head = static_cast<std::size_t>(aligned - raw);
  std::size_t tail = alignment - head;
  if (head != 0) munmap(raw, head);
  if (tail != 0) munmap(aligned + size, tail);
  return aligned;
}

void unmap(void* p, std::size_t size) {
  BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(p) % kOsPageSize == 0 && size % kOsPageSize == 0);
  munmap(p, size);
  stats::g.os_unmap_calls.fetch_add(1, std::memory_order_relaxed);
}

void decommit(void* p, std::size_t size) {
  BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(p) % kOsPageSize == 0 && size % kOsPageSize == 0);
  const int saved_errno = errno;
  // Refused (EINVAL: locked pages, where the kernel may have dropped the unlocked mappings before
  // the first locked one; EPERM: a seccomp filter): written with zeros, which faults back any
  // page it dropped, as zeros. Not on ENOMEM, which says part of the range is not mapped: brisk
  // never decommits such a range, and writing it would fault.
  if (madvise(p, size, MADV_DONTNEED) != 0 && errno != ENOMEM) std::memset(p, 0, size);
  errno = saved_errno;
  stats::g.os_decommit_calls.fetch_add(1, std::memory_order_relaxed);
}

namespace {
// process_madvise's target, the calling thread (PIDFD_SELF_THREAD, <linux/pidfd.h>, Linux 6.15),
// whose memory is the process's: no pidfd to open, or to open again in a child of fork, whose
// pidfd of its parent would name the parent. Not PIDFD_SELF_THREAD_GROUP: that names the main
// thread, and once the main thread has called pthread_exit the call fails with ESRCH.
constexpr int kPidfdSelfThread = -10000;
// Set once process_madvise has refused: EBADF (a kernel before 6.15, which takes the sentinel for
// a bad descriptor), EINVAL before any call of it has worked (before 6.13 DONTNEED was not among
// its advice), ENOSYS (before 5.10), EPERM (a seccomp filter, which stays once installed) or
// ESRCH. An EINVAL after a call has worked is the ranges' (locked pages: a program that mlocks a
// buffer it then frees, or calls mlockall): that batch goes a madvise per range, and later ones
// are batched again.
std::atomic<bool> g_batch_refused{false};
std::atomic<bool> g_batch_worked{false};  // a call has done its ranges whole

// One process_madvise of `advice` over every range; false if the kernel did not do it whole
// (refused, latched in g_batch_refused, or stopped part way: the caller then advises each range
// on its own, which for ranges already done drops nothing new). errno is the caller's to keep.
bool advise_batch(const PageRange* ranges, std::size_t n, int advice) {
#ifdef SYS_process_madvise
  if (n < 2 || g_batch_refused.load(std::memory_order_relaxed)) return false;
  struct iovec iov[kMaxDecommitRanges];
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(ranges[i].start) % kOsPageSize == 0 &&
                 ranges[i].size % kOsPageSize == 0);
    iov[i].iov_base = ranges[i].start;
    iov[i].iov_len = ranges[i].size;
    total += ranges[i].size;
  }
  const long done = syscall(SYS_process_madvise, kPidfdSelfThread, iov, n, advice, 0u);
  if (done >= 0 && static_cast<std::size_t>(done) == total) {
    if (!g_batch_worked.load(std::memory_order_relaxed)) g_batch_worked.store(true, std::memory_order_relaxed);
    stats::g.os_decommit_calls.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const bool supported = g_batch_worked.load(std::memory_order_relaxed);
  if (done < 0 && (errno == EBADF || (errno == EINVAL && !supported) || errno == ENOSYS || errno == EPERM || errno == ESRCH))
    g_batch_refused.store(true, std::memory_order_relaxed);
#else
  (void)ranges, (void)n, (void)advice;
#endif
  return false;
}

// `advice` over every range in one call, or `each` over each range; the calls made. errno kept.
std::size_t advise_all(const PageRange* ranges, std::size_t n, int advice, void (*each)(void*, std::size_t)) {
  BRISK_ASSERT(n <= kMaxDecommitRanges);
  if (n == 0) return 0;
  const int saved_errno = errno;
  std::size_t calls = 1;
  if (!advise_batch(ranges, n, advice)) {
    for (std::size_t i = 0; i < n; ++i) each(ranges[i].start, ranges[i].size);
    calls = n;
  }
  errno = saved_errno;
  return calls;
}

}  // namespace

std::size_t decommit_all(const PageRange* ranges, std::size_t n) { return advise_all(ranges, n, MADV_DONTNEED, decommit); }
std::size_t lazy_free_all(const PageRange* ranges, std::size_t n) { return advise_all(ranges, n, MADV_FREE, lazy_free); }

bool decommit_all_batches() { return !g_batch_refused.load(std::memory_order_relaxed); }

void lazy_free(void* p, std::size_t size) {
  BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(p) % kOsPageSize == 0 && size % kOsPageSize == 0);
  if (madvise(p, size, MADV_FREE) != 0) madvise(p, size, MADV_DONTNEED);  // EINVAL before Linux 4.5
  stats::g.os_decommit_calls.fetch_add(1, std::memory_order_relaxed);
}

namespace {
// <linux/mman.h>'s value (Linux 5.14), for C libraries whose headers predate it (glibc 2.35):
// the kernel, not the headers, decides whether it is known.
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;
#endif
// Set once madvise has refused MADV_POPULATE_WRITE for good: EINVAL (a kernel before 5.14, which
// does not know the advice; brisk asks only for pages of its own private read-write mappings, so
// not for a mapping the advice cannot apply to), ENOSYS or EPERM (a seccomp filter).
std::atomic<bool> g_populate_refused{false};
}  // namespace

bool populate(void* p, std::size_t size) {
  BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(p) % kOsPageSize == 0 && size % kOsPageSize == 0);
  if (g_populate_refused.load(std::memory_order_relaxed)) return false;
  int saved_errno = errno;
  bool done = madvise(p, size, kMadvPopulateWrite) == 0;
  if (!done && (errno == EINVAL || errno == ENOSYS || errno == EPERM))
    g_populate_refused.store(true, std::memory_order_relaxed);
  errno = saved_errno;
  if (done) stats::g.os_populate_calls.fetch_add(1, std::memory_order_relaxed);
  return done;
}

void no_huge_pages(void* p, std::size_t size) {
  const int saved_errno = errno;
  madvise(p, size, MADV_NOHUGEPAGE);
  errno = saved_errno;
}

bool barrier_all_threads() {
  // The command numbers of <linux/membarrier.h>, which glibc's headers do not pull in.
  constexpr int kPrivateExpedited = 1 << 3, kRegisterPrivateExpedited = 1 << 4;
  int saved_errno = errno;  // brisk_trim and malloc_trim leave errno alone
  bool done = syscall(SYS_membarrier, kPrivateExpedited, 0, 0) == 0;
  // Not registered yet (EPERM; registration is per process, and a child of fork may need its
  // own), or not supported (EINVAL, ENOSYS).
  if (!done && errno == EPERM && syscall(SYS_membarrier, kRegisterPrivateExpedited, 0, 0) == 0)
    done = syscall(SYS_membarrier, kPrivateExpedited, 0, 0) == 0;
  errno = saved_errno;
  return done;
}

namespace {

// Calls run(start, bytes, resident) for each maximal run of [p, p+size) whose pages are all
// resident or all not, in address order (mincore). One vector byte per page; 4096 of them cover
// 16 MiB per call. mincore only reads page tables: unlike madvise or munmap it flushes no TLB,
// which in a VM costs an interrupt to every other CPU. Where mincore fails, its window counts as
// resident (unknown: the callers then do what is safe for resident pages), or, with
// !unknown_resident, as not resident (a caller that reads the pages: they may be unmapped).
template <typename Run>
void for_each_resident_run(void* p, std::size_t size, Run run, bool unknown_resident = true) {
  unsigned char vec[4096];
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's instrumentation can leave the use-after-scope marks of a frame that returned in the
  // stack's shadow, and the frame that comes there next sets no shadow for a variable of its
  // outermost scope: AddressSanitizer's check of mincore's write reported vec, this frame's
  // own, as out of scope (ci75, debug_leak_test, after a leak scan). It is ours while we run.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // it reads only the shadow, not vec
  __asan_unpoison_memory_region(vec, sizeof vec);
#pragma GCC diagnostic pop
#endif
  stats::g.os_resident_calls.fetch_add(1, std::memory_order_relaxed);
  char* c = static_cast<char*>(p);
  for (std::size_t done = 0; done < size;) {
    std::size_t window = size - done;
    if (window > sizeof vec * kOsPageSize) window = sizeof vec * kOsPageSize;
    char* w = c + done;
    done += window;
    if (mincore(w, window, vec) != 0) {
      run(w, window, unknown_resident);
      continue;
    }
    const std::size_t pages = window / kOsPageSize;
    for (std::size_t i = 0; i < pages;) {
      const unsigned char resident = vec[i] & 1;
      std::size_t j = i + 1;
      while (j < pages && (vec[j] & 1) == resident) ++j;
      run(w + i * kOsPageSize, (j - i) * kOsPageSize, resident != 0);
      i = j;
    }
  }
}

}  // namespace

std::size_t resident_bytes(void* p, std::size_t size) {
  std::size_t resident = 0;
  for_each_resident_run(p, size, [&](char*, std::size_t bytes, bool in) { resident += in ? bytes : 0; });
  return resident;
}

namespace {

// The file a descriptor that brisk keeps was opened on (device and inode), so that each use can
// check its number still names that file: the program may close a descriptor it did not open (a
// daemon closing every descriptor) and get the number back for another file. Recorded before the
// descriptor is published; two threads recording at once record the same file.
struct KeptFile {
  std::atomic<std::uint64_t> dev{0};
  std::atomic<std::uint64_t> ino{0};
  void record(const struct stat& st) {
    dev.store(static_cast<std::uint64_t>(st.st_dev), std::memory_order_relaxed);
    ino.store(static_cast<std::uint64_t>(st.st_ino), std::memory_order_relaxed);
  }
  bool named_by(int fd) const {
    struct stat st;
    return fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_dev) == dev.load(std::memory_order_relaxed) &&
           static_cast<std::uint64_t>(st.st_ino) == ino.load(std::memory_order_relaxed);
  }
};

// /proc/self/pagemap of the process that opened it: the pid in the upper half, the descriptor
// (or kPagemapMissing: no /proc, or a kernel that refuses it) in the lower; 0 until first use.
// Each use checks the descriptor is still that file (one getpid, one fstat), and opens it again
// if not. A descriptor inherited through fork (or _Fork, or a clone that runs no atfork handler)
// reads the parent's page tables. And the program may close a descriptor it did not open (a
// daemon closing every descriptor) and get its number back for another file: read as pagemap,
// /dev/zero would say every page is untouched, and calloc would keep old data. The number is
// never closed here once published, since it may be the program's by then. (A close racing
// with the read that follows the check is not caught: programs close others' descriptors at
// start-up or right after fork, with no other thread allocating.)
constexpr std::uint32_t kPagemapMissing = 0xFFFFFFFEu;
std::atomic<std::uint64_t> g_pagemap{0};
KeptFile g_pagemap_file;  // recorded before g_pagemap publishes the descriptor
std::atomic<bool> g_pagemap_disabled_for_test{false};

// The descriptor, or -1 if pagemap cannot be read.
int pagemap_fd() {
  if (g_pagemap_disabled_for_test.load(std::memory_order_relaxed)) return -1;
  const int saved_errno = errno;
  const auto pid = static_cast<std::uint32_t>(getpid());
  std::uint64_t seen = g_pagemap.load(std::memory_order_acquire);
  int fd = -1;
  for (;;) {
    if (seen != 0 && (seen >> 32) == pid) {
      const auto published = static_cast<std::uint32_t>(seen);
      if (published == kPagemapMissing) break;
      if (g_pagemap_file.named_by(static_cast<int>(published))) {
        fd = static_cast<int>(published);
        break;
      }
    }
    const int opened = open_nc("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    struct stat st;
    const bool usable = opened >= 0 && fstat(opened, &st) == 0;
    if (usable) g_pagemap_file.record(st);
    const std::uint64_t mine = (std::uint64_t{pid} << 32) | (usable ? static_cast<std::uint32_t>(opened) : kPagemapMissing);
    if (g_pagemap.compare_exchange_strong(seen, mine, std::memory_order_acq_rel)) {
      fd = usable ? opened : -1;
      if (!usable && opened >= 0) close_nc(opened);
      break;
    }
    if (opened >= 0) close_nc(opened);  // never published: another thread's won
  }
  errno = saved_errno;
  return fd;
}

// pagemap's bits for one page (Documentation/admin-guide/mm/pagemap.rst): present in RAM, or
// swapped out. Neither: not touched since it was mapped or last decommitted, so it reads as
// zeros already. (A page only read maps the shared zero page, and counts as present.)
constexpr std::uint64_t kPagePresent = std::uint64_t{1} << 63;
constexpr std::uint64_t kPageSwapped = std::uint64_t{1} << 62;
enum class PageState { kEmpty, kPresent, kSwapped };

PageState page_state(std::uint64_t entry) {
  if ((entry & kPagePresent) != 0) return PageState::kPresent;
  return (entry & kPageSwapped) != 0 ? PageState::kSwapped : PageState::kEmpty;
}

// zero_pages for one window of at most kZeroWindow pages. mincore says which pages are resident:
// those are zeroed in place. The others are untouched since they were mapped or decommitted
// (they read as zeros) or swapped out (they hold data): pagemap tells them apart, in one read
// from the first such page to the last; where it cannot be read, every one of them is
// decommitted. mincore first, since it is the cheaper question (about 0.7 us for 50 pages here,
// against 1.6 us for pagemap's read with its checks) and a block written whole, the common case
// of calloc, needs no other.
constexpr std::size_t kZeroWindow = 512;  // pages: 2 MiB

bool zero_window(char* w, std::size_t pages) {
  unsigned char vec[kZeroWindow];
  std::uint64_t entries[kZeroWindow];
  stats::g.os_resident_calls.fetch_add(1, std::memory_order_relaxed);
  if (mincore(w, pages * kOsPageSize, vec) != 0) {  // unknown: zeroed as if resident
    std::memset(w, 0, pages * kOsPageSize);
    return true;
  }
  std::size_t first = pages, last = 0;
  for (std::size_t i = 0; i < pages; ++i) {
    if ((vec[i] & 1) != 0) continue;
    if (first == pages) first = i;
    last = i;
  }
  if (first == pages) {  // every page present: the common case of a block written whole
    std::memset(w, 0, pages * kOsPageSize);
    return true;
  }
  bool mapped = false;  // entries[first..last] read from pagemap
  if (const int fd = pagemap_fd(); fd >= 0) {
    const std::size_t n = last - first + 1;
    const auto offset = static_cast<off_t>((reinterpret_cast<std::uintptr_t>(w) / kOsPageSize + first) * sizeof(std::uint64_t));
    const int saved_errno = errno;
    mapped = pread_nc(fd, entries + first, n * sizeof(std::uint64_t), offset) == static_cast<ssize_t>(n * sizeof(std::uint64_t));
    errno = saved_errno;
  }
  auto state_of = [&](std::size_t i) {
    if ((vec[i] & 1) != 0) return PageState::kPresent;
    return mapped ? page_state(entries[i]) : PageState::kSwapped;  // unknown: decommitted
  };
  for (std::size_t i = 0; i < pages;) {
    const PageState state = state_of(i);
    std::size_t j = i + 1;
    while (j < pages && state_of(j) == state) ++j;
    // Present although mincore saw it absent (touched or swapped in since): zeroed in place.
    if (state == PageState::kPresent) std::memset(w + i * kOsPageSize, 0, (j - i) * kOsPageSize);
    else if (state == PageState::kSwapped) decommit(w + i * kOsPageSize, (j - i) * kOsPageSize);
    i = j;
  }
  return false;
}

}  // namespace

bool zero_pages(void* p, std::size_t size) {
  BRISK_ASSERT(reinterpret_cast<std::uintptr_t>(p) % kOsPageSize == 0 && size % kOsPageSize == 0);
  char* c = static_cast<char*>(p);
  bool all_present = true;
  for (std::size_t done = 0; done < size;) {
    std::size_t window = size - done;
    if (window > kZeroWindow * kOsPageSize) window = kZeroWindow * kOsPageSize;
    all_present = zero_window(c + done, window / kOsPageSize) && all_present;
    done += window;
  }
  return all_present;
}

void disable_pagemap_for_test(bool disabled) { g_pagemap_disabled_for_test.store(disabled, std::memory_order_relaxed); }
int pagemap_descriptor_for_test() { return pagemap_fd(); }

namespace {
std::atomic<std::uint64_t (*)()> g_test_clock{nullptr};
}  // namespace

void set_clock_for_test(std::uint64_t (*clock)()) { g_test_clock.store(clock, std::memory_order_release); }

void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

namespace {
// The signal mask of the thread that called start_thread last (the program's), before it
// blocked every signal for the new thread.
sigset_t g_starter_mask;
}  // namespace

bool start_thread(void* (*fn)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the new thread inherits the mask
  g_starter_mask = old;  // read by the new thread only (restore_starter_signal_mask), after its start
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  bool ok = pthread_create(&t, &attr, fn, arg) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

void restore_starter_signal_mask() { pthread_sigmask(SIG_SETMASK, &g_starter_mask, nullptr); }

void wait_while_equal(const std::atomic<std::uint32_t>* word, std::uint32_t expected, std::uint64_t ms) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t), "a futex word");
  const int saved_errno = errno;
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
  errno = saved_errno;
}

void wake_all(const std::atomic<std::uint32_t>* word) {
  const int saved_errno = errno;
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  errno = saved_errno;
}

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000 + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t now_ms() {
  if (auto clock = g_test_clock.load(std::memory_order_acquire); BRISK_UNLIKELY(clock != nullptr)) return clock();
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000 + static_cast<std::uint64_t>(ts.tv_nsec) / 1000000;
}

namespace {

// ThreadSanitizer does not see mremap. The address space a moved or shrunk mapping leaves keeps
// the shadow of the accesses made there, and when another thread's mapping later grows in place
// over it, that thread's writes were reported as racing with them (tests/difftest under TSan,
// about 1 run in 30: a large block moved by realloc, then another thread's block grown over its
// old place), though the kernel orders the two: the space is left before it is taken. A release
// before every mremap and an acquire after it, on one address, tell TSan that order.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
char g_remap_order;
void remap_begin() { __tsan_release(&g_remap_order); }
void remap_end() { __tsan_acquire(&g_remap_order); }
#else
void remap_begin() {}
void remap_end() {}
#endif

}  // namespace

bool remap_in_place(void* p, std::size_t old_size, std::size_t new_size) {
  remap_begin();
  void* r = mremap(p, old_size, new_size, 0);
  remap_end();
  return r != MAP_FAILED;
}

bool remap_to(void* old_p, std::size_t old_size, void* target, std::size_t new_size) {
  remap_begin();
  void* r = mremap(old_p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  remap_end();
  return r != MAP_FAILED;
}

std::uint64_t current_thread_id() { return static_cast<std::uint64_t>(syscall(SYS_gettid)); }

std::uint32_t current_process_id() { return static_cast<std::uint32_t>(syscall(SYS_getpid)); }

bool thread_gone(std::uint32_t pid, std::uint64_t tid) {
  const int saved_errno = errno;
  const bool gone = syscall(SYS_tgkill, static_cast<pid_t>(pid), static_cast<pid_t>(tid), 0) != 0 && errno == ESRCH;
  errno = saved_errno;
  return gone;
}

namespace {

// A small /proc file's first size - 1 bytes into text, terminated; false if it cannot be read.
bool read_proc_file(const char* path, char* text, std::size_t size) {
  int fd = open_nc(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n;
  do {
    n = read_nc(fd, text, size - 1);
  } while (n < 0 && errno == EINTR);
  close_nc(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  return true;
}

}  // namespace

std::size_t process_resident_bytes() {
  char text[128];
  if (!read_proc_file("/proc/self/statm", text, sizeof text)) return 0;
  // "size resident shared text lib data dt", in pages.
  const char* p = text;
  while (*p >= '0' && *p <= '9') ++p;
  if (*p != ' ') return 0;
  ++p;
  std::size_t pages = 0;
  if (*p < '0' || *p > '9') return 0;
  for (; *p >= '0' && *p <= '9'; ++p) pages = pages * 10 + static_cast<std::size_t>(*p - '0');
  return pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

namespace {

// /proc/self/stat's state (the main thread's: 'Z' once it has called pthread_exit while other
// threads run) and num_threads (every thread of the process, such a main thread included: one
// count the kernel keeps, where a listing of /proc/self/task is no snapshot and can miss a
// thread while another exits). False if it cannot be read.
bool read_self_stat(char* state, std::size_t* threads) {
  char text[1024];
  if (!read_proc_file("/proc/self/stat", text, sizeof text)) return false;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'; the state is the 3rd field, the 1st after it, num_threads the 20th.
  const char* p = strrchr(text, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return false;
  *state = p[2];
  for (int field = 2; field < 20; ++field) {
    p = strchr(p + 1, ' ');
    if (p == nullptr) return false;
  }
  std::size_t n = 0;
  for (++p; *p >= '0' && *p <= '9'; ++p) n = n * 10 + static_cast<std::size_t>(*p - '0');
  *threads = n;
  return true;
}

}  // namespace

std::size_t process_thread_count() {
  char state;
  std::size_t threads;
  return read_self_stat(&state, &threads) ? threads : 0;
}

long other_running_threads() {
  const int saved_errno = errno;
  char state;
  std::size_t threads;
  const bool read = read_self_stat(&state, &threads) && threads > 0;
  errno = saved_errno;
  if (!read) return -1;
  auto others = static_cast<long>(threads) - 1;  // not the caller, which runs
  if (state == 'Z' || state == 'X') --others;     // the main thread, gone by pthread_exit
  return others < 0 ? 0 : others;
}

void for_each_resident_page_run(std::uintptr_t begin, std::uintptr_t end,
                                void (*visit)(std::uintptr_t begin, std::uintptr_t end, void* context), void* context) {
  const std::uintptr_t from = begin & ~(kOsPageSize - 1);
  const std::uintptr_t to = (end + kOsPageSize - 1) & ~(kOsPageSize - 1);
  for_each_resident_run(
      reinterpret_cast<void*>(from), to - from,
      [&](char* run, std::size_t bytes, bool resident) {
        const auto at = reinterpret_cast<std::uintptr_t>(run);
        if (resident) visit(std::max(begin, at), std::min(end, at + bytes), context);
      },
      false);
}

namespace {

std::uintptr_t parse_hex(const char*& p) {
  std::uintptr_t v = 0;
  for (;; ++p) {
    const char c = *p;
    if (c >= '0' && c <= '9') v = v << 4 | static_cast<std::uintptr_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = v << 4 | static_cast<std::uintptr_t>(c - 'a' + 10);
    else return v;
  }
}

// One line of /proc/self/maps: "begin-end perms offset dev inode [path]".
void visit_mapping_line(const char* line, MappingVisitor visit, void* context) {
  const char* p = line;
  const std::uintptr_t begin = parse_hex(p);
  if (*p++ != '-') return;
  const std::uintptr_t end = parse_hex(p);
  if (*p++ != ' ' || p[0] == '\0' || p[1] == '\0' || p[2] == '\0' || p[3] == '\0') return;
  Mapping m{begin, end, p[0] == 'r', p[1] == 'w', p[3] == 'p', ""};
  for (int field = 0; field < 4 && p != nullptr; ++field) p = strchr(p + 1, ' ');  // to the path
  if (p != nullptr) {
    while (*p == ' ') ++p;
    m.path = p;
  }
  visit(m, context);
}

}  // namespace

bool for_each_mapping(MappingVisitor visit, void* context) {
  // The calling thread's view (Linux 3.17 on), which is the process's: /proc/self/maps is read
  // through the main thread, and once that thread has called pthread_exit it lists nothing.
  int fd = open_nc("/proc/thread-self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) fd = open_nc("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  static char text[16384];  // one caller at a time: the leak report, at exit, single-threaded
  std::size_t held = 0;
  for (;;) {
    ssize_t n;
    do {
      n = read_nc(fd, text + held, sizeof text - 1 - held);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) break;
    held += static_cast<std::size_t>(n);
    text[held] = '\0';
    char* line = text;
    for (char* nl; (nl = strchr(line, '\n')) != nullptr; line = nl + 1) {
      *nl = '\0';
      visit_mapping_line(line, visit, context);
    }
    held = static_cast<std::size_t>(text + held - line);
    memmove(text, line, held);
    if (held == sizeof text - 1) held = 0;  // a line longer than the buffer: dropped
  }
  close_nc(fd);
  return true;
}

namespace {
// 0: not asked yet, 1: no, 2: yes. getauxval allocates nothing, so it may run in the first malloc.
std::atomic<int> g_secure_execution{0};

bool secure_execution() {
  int s = g_secure_execution.load(std::memory_order_relaxed);
  if (s == 0) {
    s = getauxval(AT_SECURE) != 0 ? 2 : 1;
    g_secure_execution.store(s, std::memory_order_relaxed);
  }
  return s == 2;
}
}  // namespace

const char* get_env(const char* name) {
  if (environ == nullptr || secure_execution()) return nullptr;
  std::size_t n = strlen(name);
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  }
  return nullptr;
}

namespace {

// keep_stderr's duplicate (-1: none), and the file it is, for write_stderr's check.
std::atomic<int> g_kept_stderr{-1};
KeptFile g_kept_stderr_file;
constexpr int kKeptStderrLowest = 64;

// write_fd's loop: 0 once everything is written, else the errno it gave up on.
int write_all(int fd, const char* text, std::size_t length) {
  while (length > 0) {
    ssize_t w = write_nc(fd, text, length);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    text += w;
    length -= static_cast<std::size_t>(w);
  }
  return 0;
}

}  // namespace

void write_stderr(const char* text, std::size_t length) {
  if (write_all(2, text, length) != EBADF) return;
  const int kept = g_kept_stderr.load(std::memory_order_acquire);
  if (kept >= 0 && g_kept_stderr_file.named_by(kept)) write_all(kept, text, length);
}

void keep_stderr() {
  if (g_kept_stderr.load(std::memory_order_acquire) >= 0) return;
  struct stat st;
  if (fstat(2, &st) != 0) return;
  const int fd = static_cast<int>(syscall(SYS_fcntl, 2, F_DUPFD_CLOEXEC, kKeptStderrLowest));
  if (fd < 0) return;
  g_kept_stderr_file.record(st);
  int none = -1;
  if (!g_kept_stderr.compare_exchange_strong(none, fd, std::memory_order_acq_rel)) close_nc(fd);
}

int open_log_file(const char* path) { return open_nc(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644); }

void write_fd(int fd, const char* text, std::size_t length) { write_all(fd, text, length); }

void abort_process() { abort(); }

std::uint64_t random_u64() {
  std::uint64_t r = 0;
  // syscall(2): glibc's getrandom is a cancellation point (see open_nc).
  if (syscall(SYS_getrandom, &r, sizeof r, GRND_NONBLOCK) == static_cast<long>(sizeof r) && r != 0) return r;
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  r = static_cast<std::uint64_t>(ts.tv_nsec) * 0x9E3779B97F4A7C15ull ^
      reinterpret_cast<std::uintptr_t>(&r) ^ static_cast<std::uint64_t>(getpid()) << 32;
  return r | 1;
}

}  // namespace brisk::platform
