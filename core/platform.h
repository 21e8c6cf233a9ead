// The platform layer: the only code in brisk that talks to the OS (mmap, munmap, mremap,
// madvise, mincore, /proc/self/pagemap, the environment, stderr).
//
// Contract, for every function here:
//   - Sizes and addresses passed in are multiples of kOsPageSize (4096); alignments are powers
//     of two >= kOsPageSize. Violations are programming errors inside brisk: BRISK_ASSERT
//     (core/assert.h) checks them in a checked build.
//   - Nothing here allocates with malloc, takes a lock, or touches brisk's own state (its own
//     is atomics: the pagemap descriptor, test switches), so it is safe during initialisation,
//     in a fork handler and from any thread.
//   - Mapping failures return nullptr / false and never abort; the caller turns them into
//     ENOMEM. Memory fresh from map() or map_aligned() is zero-filled.
//   - decommit() drops the pages' contents and resident memory; the range stays mapped and reads
//     back as zeros on next touch (Linux MADV_DONTNEED on private anonymous memory).
//
// A test may inject mapping failures with set_map_failure_after() to drive the out-of-memory
// paths of the layers above.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace brisk::platform {

void* map(std::size_t size);
void* map_aligned(std::size_t size, std::size_t alignment);
void unmap(void* p, std::size_t size);
// Drops the pages of [p, p+size): afterwards they read as zeros, which callers trust (a chunk's
// clean pages, a clean large-cache entry: calloc skips its memset there). Where the kernel
// refuses (EINVAL: locked pages, after mlock or mlockall; EPERM: a seccomp filter), they are
// zeroed in place instead: they stay resident, as locked pages do anyway, and still read as
// zeros. errno is left as it was.
void decommit(void* p, std::size_t size);
// decommit() of each of n page ranges (n <= kMaxDecommitRanges), in one system call where the
// kernel allows it: process_madvise(2) on the calling process (PIDFD_SELF_THREAD, Linux 6.15 and
// later) with MADV_DONTNEED, which since Linux 6.16 flushes the other CPUs' TLBs once for all the
// ranges instead of once per range. Where the kernel refuses that, this and every later call
// make one madvise per range (decommit_all_batches() is false from then on); where it refuses
// one batch's ranges (locked pages, once a batch has worked), that batch goes a madvise per range
// and batching stays on. Returns the system calls made. errno is left as it was.
struct PageRange {
  void* start;
  std::size_t size;
};
inline constexpr std::size_t kMaxDecommitRanges = 64;
std::size_t decommit_all(const PageRange* ranges, std::size_t n);
bool decommit_all_batches();
// Gives the pages' contents to the kernel to take when it needs memory (Linux MADV_FREE): until
// it does, the pages stay resident and keep their data, and a write takes them back without a
// fault. So they read as either their old data or zeros. Falls back to decommit where MADV_FREE
// is missing.
void lazy_free(void* p, std::size_t size);
// lazy_free() of each of n page ranges, batched as decommit_all batches (Linux 6.16 batches the
// TLB flush of MADV_FREE too). Returns the system calls made. errno is left as it was.
std::size_t lazy_free_all(const PageRange* ranges, std::size_t n);
// Makes the pages of [p, p+size), private anonymous memory the caller is about to write, present
// and writable now (Linux MADV_POPULATE_WRITE, 5.14 and later): one system call instead of a
// page fault per page. Their contents do not change. False: not done, or only in part (the
// kernel lacks the advice or a filter refuses it, after which every call returns false at once;
// or it had no memory for them, or was interrupted); the caller's writes then fault the rest in
// as they would have. errno is left as it was.
bool populate(void* p, std::size_t size);
// Grows or shrinks a mapping without moving it. False if the neighbouring space is taken.
bool remap_in_place(void* p, std::size_t old_size, std::size_t new_size);
// Moves the pages of [old_p, old_p+old_size) to target (which must be a mapping of at least
// new_size that this call replaces) and resizes them to new_size, without copying data.
bool remap_to(void* old_p, std::size_t old_size, void* target, std::size_t new_size);

// A memory barrier executed by every thread of the process before this returns (Linux
// membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, registered on first use): the heavy side of an
// asymmetric fence, whose light side is a compiler barrier. False where the kernel lacks it.
bool barrier_all_threads();

// Asks the kernel to back [p, p+size) with base pages only (MADV_NOHUGEPAGE): for a mapping
// that is mostly never touched, where under transparent_hugepage=always a first write could
// bring in 2 MiB. Best effort (a kernel without huge pages has nothing to do); errno is kept.
void no_huge_pages(void* p, std::size_t size);
// Bytes of [p, p+size) currently resident (mincore), counted in windows on the stack.
std::size_t resident_bytes(void* p, std::size_t size);
// Makes [p, p+size), a private anonymous range, read as zeros: each run of pages present in
// RAM is written with zeros, each run of swapped-out pages decommitted, and pages never touched
// since they were mapped or decommitted are left alone (they read as zeros already, and a memset
// would fault each one in). No present page is dropped, so no page of another CPU's TLB is shot
// down, none faults back in, and none that the program reads before writing maps the shared
// zero page and then faults again to be copied. One mincore per 2 MiB, and where it finds pages
// not resident one read of /proc/self/pagemap to tell untouched from swapped out; where pagemap
// cannot be read, every page not resident is decommitted (one madvise per run). True: every
// page was present (all of them are now, zeroed in place).
bool zero_pages(void* p, std::size_t size);
// Tests: true makes zero_pages decommit every page mincore finds not resident, as if pagemap
// could not be read. pagemap_descriptor_for_test: the descriptor zero_pages would read now
// (opened, checked or opened again as zero_pages does), or -1.
void disable_pagemap_for_test(bool disabled);
int pagemap_descriptor_for_test();

// A coarse monotonic clock in milliseconds (vDSO, no system call): for purge decay and the
// background thread only. A test may replace it (set_clock_for_test; nullptr restores it).
std::uint64_t now_ms();
// A fine monotonic clock in nanoseconds (vDSO, no system call): for timing a page's fault or
// populate call (core/page_cost.h). Not replaced by set_clock_for_test.
std::uint64_t now_ns();
void set_clock_for_test(std::uint64_t (*clock)());
// Runs fn(arg) on a new detached thread with every signal blocked (so the process's signals
// go to its own threads), on a stack of the size pthread_create gives by default: the thread
// may be the process's last and then runs its exit handlers (background.cc). False if the
// thread could not be created.
bool start_thread(void* (*fn)(void*), void* arg);
// For a thread start_thread made, about to end as the process's last thread (whose exit
// handlers then run on it): gives it back the signal mask of the thread that started it, the
// program's, so that a signal sent meanwhile acts as it would on a thread of the program.
void restore_starter_signal_mask();
void name_this_thread(const char* name);  // as top and ps -L show it
// Sleeps up to ms milliseconds while *word holds expected (a private futex): returns at once
// if it does not, when wake_all(word) is called, or early on a signal. errno kept.
void wait_while_equal(const std::atomic<std::uint32_t>* word, std::uint32_t expected, std::uint64_t ms);
void wake_all(const std::atomic<std::uint32_t>* word);
// How many threads of the process besides the calling one have not exited: /proc/self/stat's
// count of its threads, less a main thread that called pthread_exit (a zombie, counted until
// the process ends); a thread on its way out counts until the kernel has released it. Read
// without malloc; -1 if it cannot be read. errno kept.
long other_running_threads();

// The calling thread's OS id (gettid).
std::uint64_t current_thread_id();
// The calling process's OS id (getpid: a system call, so right in a child whatever fork made it).
std::uint32_t current_process_id();
// True only if process pid has no thread of OS id tid any more (tgkill with signal 0 finds none:
// ESRCH). A thread that is exiting counts as present until the kernel has released it; any
// other failure counts as present too. errno kept.
bool thread_gone(std::uint32_t pid, std::uint64_t tid);
// The process's resident memory (the second field of /proc/self/statm, in bytes), read
// without malloc; 0 if it cannot be read.
std::size_t process_resident_bytes();
// The number of threads of the process (/proc/self/stat's num_threads), read without malloc;
// 0 if it cannot be read.
std::size_t process_thread_count();
// The process's mappings as /proc/thread-self/maps lists them (/proc/self/maps before Linux
// 3.17), in address order, read without malloc (for the debug layer's leak scan,
// debug/leaks.cc). path: "" for an anonymous mapping, valid during the call only. Call it with
// no other thread running that could map or unmap: a line read late may describe a mapping
// already gone. False if the file cannot be read.
struct Mapping {
  std::uintptr_t begin, end;
  bool readable, writable, is_private;
  const char* path;
};
using MappingVisitor = void (*)(const Mapping& mapping, void* context);
bool for_each_mapping(MappingVisitor visit, void* context);
// visit(begin, end, context) for each run of [begin, end) on pages mincore says are resident
// (the run clipped to [begin, end)); pages it does not vouch for are left out.
void for_each_resident_page_run(std::uintptr_t begin, std::uintptr_t end,
                                void (*visit)(std::uintptr_t begin, std::uintptr_t end, void* context), void* context);

// getenv without malloc: scans the process environment. nullptr if unset, and for every name
// when the kernel started the process in secure-execution mode (AT_SECURE: a set-user-ID or
// set-group-ID program, or one that gained file capabilities): its environment is then the
// invoking user's while its privileges are not, so brisk reads no BRISK_* variable in it, as
// glibc ignores MALLOC_CHECK_ there (BRISK_DEBUG_LOG would have such a program append its
// reports to any file the user names).
const char* get_env(const char* name);
// Writes text to descriptor 2. Where descriptor 2 is closed, to the duplicate keep_stderr took,
// if that is still the file descriptor 2 was then (checked with fstat: a program that closes
// every descriptor may have closed it, and its number may name another file since).
void write_stderr(const char* text, std::size_t length);
// Takes a private duplicate of descriptor 2 (close-on-exec, numbered 64 or more, out of the way
// of the low numbers programs count on), once: the debug layer's reports and BRISK_STATS's table
// at exit come after the program's own exit handlers, and many close stderr there (coreutils'
// close_stdout does), which lost them for such a program. Taken when debug mode starts and, with
// BRISK_STATS set, at load. Nothing happens if descriptor 2 is not open.
void keep_stderr();
// A log file opened for appending (created 0644 if missing): a descriptor, or -1.
int open_log_file(const char* path);
// Writes all of text to fd, retrying short writes and EINTR; gives up silently on an error.
void write_fd(int fd, const char* text, std::size_t length);
[[noreturn]] void abort_process();
// 64 random bits from the kernel, falling back to a time and address mix.
std::uint64_t random_u64();

// Test hook: after n more successful maps, every map fails (n < 0: never fail).
void set_map_failure_after(long n);

}  // namespace brisk::platform
