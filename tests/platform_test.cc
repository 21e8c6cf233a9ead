// Out of memory, injected through the platform layer: every entry point fails cleanly with
// ENOMEM, and blocks allocated before stay intact.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>
#include <vector>

#include "core/platform.h"
#include "core/stats.h"
#include "tests/test_util.h"

namespace brisk {
namespace {

struct MapFailureGuard {
  explicit MapFailureGuard(long after) { platform::set_map_failure_after(after); }
  ~MapFailureGuard() { platform::set_map_failure_after(-1); }
};

TEST(Platform, OutOfMemoryGivesEnomemAndKeepsOtherBlocks) {
  std::vector<unsigned char*> live;
  for (int i = 0; i < 100; ++i) {
    auto* p = static_cast<unsigned char*>(brisk_malloc(1000));
    std::memset(p, i, 1000);
    live.push_back(p);
  }
  auto* big = static_cast<unsigned char*>(brisk_malloc(5 << 20));
  ASSERT_NE(big, nullptr);
  std::memset(big, 0x77, 5 << 20);
  brisk_thread_collect();  // the large cache would serve what follows without a mapping
  {
    MapFailureGuard fail(0);
    errno = 0;
    EXPECT_EQ(brisk_malloc(64 << 20), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    errno = 0;
    EXPECT_EQ(brisk_calloc(1, 32 << 20), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    errno = 0;
    EXPECT_EQ(brisk_aligned_alloc(8 << 20, 1 << 20), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    // A realloc that must move to new memory fails and leaves the block as it was.
    errno = 0;
    void* grown = brisk_realloc(big, 1ull << 36);
    if (grown == nullptr) {
      EXPECT_EQ(errno, ENOMEM);
      EXPECT_EQ(big[(5 << 20) - 1], 0x77);
    } else {
      big = static_cast<unsigned char*>(grown);  // mremap grew it in place: no mapping needed
    }
    // A new thread needs a heap and its first span needs a chunk: both come from the OS.
    void* from_thread = reinterpret_cast<void*>(1);
    int thread_errno = 0;
    std::thread t([&] {
      errno = 0;
      // Many blocks of a class the thread has no span for: at some point it needs a chunk.
      for (int i = 0; i < 100000 && from_thread != nullptr; ++i) from_thread = brisk_malloc(48 * 1024);
      thread_errno = errno;
    });
    t.join();
    EXPECT_EQ(from_thread, nullptr) << "with no memory from the OS the thread must run out";
    EXPECT_EQ(thread_errno, ENOMEM);
  }
  for (int i = 0; i < 100; ++i) {
    for (int j = 0; j < 1000; ++j) ASSERT_EQ(live[static_cast<std::size_t>(i)][j], static_cast<unsigned char>(i));
    brisk_free(live[static_cast<std::size_t>(i)]);
  }
  EXPECT_EQ(big[0], 0x77);
  brisk_free(big);
  // And the allocator works again once memory is back.
  void* again = brisk_malloc(64 << 20);
  EXPECT_NE(again, nullptr);
  brisk_free(again);
}


// ---- zero_pages: what calloc of reused memory relies on ----------------------------------------

constexpr std::size_t kOs = 4096;

std::size_t ResidentPages(const void* p, std::size_t pages) {
  std::vector<unsigned char> vec(pages);
  if (mincore(const_cast<void*>(p), pages * kOs, vec.data()) != 0) return SIZE_MAX;
  std::size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

std::size_t FirstNonZeroByte(const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != 0) return i;
  return SIZE_MAX;
}

bool PagemapReadable() {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Written pages are zeroed where they are (they stay resident), and pages never touched are
// left alone: no memset faults them in, and no madvise is spent on them (pagemap tells them from
// swapped-out pages, which mincore cannot). Without pagemap the untouched runs are decommitted,
// one madvise each, and still nothing untouched becomes resident.
void ZeroPagesCheck(bool use_pagemap) {
  constexpr std::size_t kPages = 32;
  platform::disable_pagemap_for_test(!use_pagemap);
  auto* p = static_cast<unsigned char*>(platform::map(kPages * kOs));
  ASSERT_NE(p, nullptr);
  for (std::size_t page : {0, 5, 6, 20}) std::memset(p + page * kOs + 100, 0xEE, 200);
  ASSERT_EQ(ResidentPages(p, kPages), 4u);
  const std::uint64_t decommits = stats::g.os_decommit_calls.load();
  platform::zero_pages(p, kPages * kOs);
  const std::uint64_t spent = stats::g.os_decommit_calls.load() - decommits;
  platform::disable_pagemap_for_test(false);
  EXPECT_EQ(ResidentPages(p, kPages), 4u) << "zero_pages made untouched pages resident, or dropped written ones";
  if (use_pagemap) EXPECT_EQ(spent, 0u) << "untouched pages were decommitted";
  else EXPECT_EQ(spent, 3u) << "one madvise per untouched run: 1-4, 7-19, 21-31";
  EXPECT_EQ(FirstNonZeroByte(p, kPages * kOs), SIZE_MAX);
  platform::unmap(p, kPages * kOs);
}

TEST(PlatformZeroPages, WithPagemapPresentPagesAreZeroedAndUntouchedOnesLeftAlone) {
  if (!PagemapReadable()) GTEST_SKIP() << "/proc/self/pagemap cannot be read here";
  ZeroPagesCheck(true);
}

TEST(PlatformZeroPages, WithoutPagemapUntouchedRunsAreDecommitted) { ZeroPagesCheck(false); }

// What the platform layer calls inside malloc's functions is no cancellation point: a thread
// with a cancellation pending (deferred, the default) goes through zero_pages (which reads
// /proc/self/pagemap: calloc of a reused block), process_resident_bytes, write_fd, the background
// thread's wait and its look at the thread list, and only then acts on it, at its own pthread_testcancel. Before, the open and pread of pagemap
// unwound it from inside calloc: the block was lost, and on the large stash's path its heap's lock
// stayed held, on which the next fork hung.
struct CancelProbe {
  unsigned char* p = nullptr;
  int devnull = -1;
  std::atomic<int> stage{0};  // 1: ready, cancellation disabled; 2: cancel sent
  bool reached = false;
};
void* CancelledThread(void* arg) {
  auto* probe = static_cast<CancelProbe*>(arg);
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
  probe->stage.store(1);
  while (probe->stage.load() != 2) std::this_thread::yield();
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, nullptr);  // pending now; deferred
  platform::zero_pages(probe->p, 32 * kOs);
  (void)platform::process_resident_bytes();
  platform::write_fd(probe->devnull, "x", 1);
  std::atomic<std::uint32_t> word{0};
  platform::wait_while_equal(&word, 0, 1);
  (void)platform::other_running_threads();
  probe->reached = true;
  pthread_testcancel();
  return nullptr;
}

// The background thread's look at the thread list (background.cc): a running thread counts
// until it has exited, the caller never.
TEST(Platform, OtherRunningThreadsCountsAThreadUntilItHasExited) {
  const long before = platform::other_running_threads();
  ASSERT_GE(before, 0) << "/proc/self/task cannot be read";
  std::atomic<bool> go{false};
  std::thread t([&go] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(platform::other_running_threads(), before + 1);
  go.store(true);
  t.join();
  // After the join the kernel may list the thread a moment longer, still running its exit.
  long after = platform::other_running_threads();
  for (int tries = 0; tries < 5000 && after != before; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    after = platform::other_running_threads();
  }
  EXPECT_EQ(after, before);
}

// A wait on a word that no longer holds the expected value returns at once; one that does
// returns when woken (here: after its time, no thread wakes it).
TEST(Platform, WaitWhileEqualReturnsWhenTheWordDiffers) {
  std::atomic<std::uint32_t> word{7};
  const auto start = std::chrono::steady_clock::now();
  platform::wait_while_equal(&word, 8, 60000);  // differs: no wait at all
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  std::thread waker([&word] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    word.store(8);
    platform::wake_all(&word);
  });
  platform::wait_while_equal(&word, 7, 60000);  // woken long before its minute
  waker.join();
  EXPECT_EQ(word.load(), 8u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(Platform, NoCallInsideMallocActsOnAPendingCancellation) {
  if (!PagemapReadable()) GTEST_SKIP() << "/proc/self/pagemap cannot be read here";
  CancelProbe probe;
  probe.p = static_cast<unsigned char*>(platform::map(32 * kOs));
  ASSERT_NE(probe.p, nullptr);
  for (std::size_t page : {0, 5, 6, 20}) std::memset(probe.p + page * kOs + 100, 0xEE, 200);  // a partly untouched block
  probe.devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(probe.devnull, 0);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, CancelledThread, &probe), 0);
  while (probe.stage.load() != 1) std::this_thread::yield();
  ASSERT_EQ(pthread_cancel(t), 0);
  probe.stage.store(2);
  void* result = nullptr;
  ASSERT_EQ(pthread_join(t, &result), 0);
  EXPECT_EQ(result, PTHREAD_CANCELED);
  EXPECT_TRUE(probe.reached) << "the thread was cancelled inside the platform layer";
  EXPECT_EQ(FirstNonZeroByte(probe.p, 32 * kOs), SIZE_MAX);
  close(probe.devnull);
  platform::unmap(probe.p, 32 * kOs);
}

// populate makes untouched pages resident without a write, counts its call, keeps their zeros
// and leaves errno alone. From Linux 5.14 on it must work; before, it returns false, and keeps
// returning false without touching anything.
TEST(Platform, PopulateMakesPagesResidentAndKeepsErrno) {
  constexpr std::size_t kPages = 8;
  auto* p = static_cast<unsigned char*>(platform::map(kPages * kOs));
  ASSERT_NE(p, nullptr);
  const std::uint64_t calls = stats::g.os_populate_calls.load();
  errno = 4242;
  const bool done = platform::populate(p + 2 * kOs, 3 * kOs);
  EXPECT_EQ(errno, 4242);
  if (brisk_test::KernelAtLeast(5, 14)) ASSERT_TRUE(done) << "MADV_POPULATE_WRITE failed on a kernel that has it";
  if (done) {
    EXPECT_EQ(stats::g.os_populate_calls.load() - calls, 1u);
    EXPECT_EQ(ResidentPages(p, kPages), 3u);
    EXPECT_EQ(platform::resident_bytes(p + 2 * kOs, 3 * kOs), 3 * kOs);
  } else {
    EXPECT_EQ(stats::g.os_populate_calls.load(), calls);
    EXPECT_EQ(ResidentPages(p, kPages), 0u);
    EXPECT_FALSE(platform::populate(p, kOs));
  }
  EXPECT_EQ(FirstNonZeroByte(p, kPages * kOs), SIZE_MAX);
  platform::unmap(p, kPages * kOs);
}

// Byte 100 of each of the pages at p, which the test filled with 0x3c: 0 where dropped(page).
template <class Dropped>
void ExpectDroppedPagesZero(const unsigned char* p, std::size_t pages, Dropped dropped) {
  for (std::size_t page = 0; page < pages; ++page)
    EXPECT_EQ(p[page * kOs + 100], dropped(page) ? 0 : 0x3c) << "page " << page;
}

// decommit_all drops the pages of every range and only theirs, keeps errno, and on a kernel
// whose process_madvise takes MADV_DONTNEED for the calling process (6.15) does it in one call.
TEST(Platform, DecommitAllDropsEveryRangeInOneCallAndKeepsErrno) {
  constexpr std::size_t kPages = 16;
  auto* p = static_cast<unsigned char*>(platform::map(kPages * kOs));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x3c, kPages * kOs);
  const platform::PageRange ranges[] = {{p + 1 * kOs, 2 * kOs}, {p + 5 * kOs, kOs}, {p + 9 * kOs, 4 * kOs}};
  errno = 4242;
  const std::size_t calls = platform::decommit_all(ranges, 3);
  EXPECT_EQ(errno, 4242);
  // Refused (a seccomp filter, say), the call falls back to a madvise per range, and says so.
  if (platform::decommit_all_batches()) EXPECT_EQ(calls, 1u) << "the ranges took a system call each";
  else EXPECT_EQ(calls, 3u);
  if (brisk_test::KernelAtLeast(6, 15) && !platform::decommit_all_batches())
    std::fprintf(stderr, "note: process_madvise refused on a 6.15+ kernel; a madvise per range\n");
  EXPECT_EQ(ResidentPages(p, kPages), kPages - 7);
  ExpectDroppedPagesZero(p, kPages, [](std::size_t page) { return (page >= 1 && page < 3) || page == 5 || (page >= 9 && page < 13); });
  platform::unmap(p, kPages * kOs);
}

// A batch refused for its ranges (locked pages) goes a madvise per range and leaves batching on
// for the batches after it, once one has worked: before, the first such refusal turned
// process_madvise off for the rest of the process (a program that mlocks a buffer it frees).
TEST(Platform, ABatchOfLockedPagesLeavesBatchingOn) {
  if (!brisk_test::KernelAtLeast(6, 15)) GTEST_SKIP() << "process_madvise of the calling process needs Linux 6.15";
  constexpr std::size_t kPages = 8;
  auto* p = static_cast<unsigned char*>(platform::map(kPages * kOs));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x3c, kPages * kOs);
  const platform::PageRange unlocked[] = {{p + 0 * kOs, kOs}, {p + 2 * kOs, kOs}};
  if (platform::decommit_all(unlocked, 2) != 1u) {
    platform::unmap(p, kPages * kOs);
    GTEST_SKIP() << "process_madvise refused here (a seccomp filter?)";
  }
  if (mlock(p + 4 * kOs, 4 * kOs) != 0 || madvise(p + 5 * kOs, kOs, MADV_DONTNEED) == 0) {
    platform::unmap(p, kPages * kOs);
    GTEST_SKIP() << "mlock refused (RLIMIT_MEMLOCK), or it locked nothing (a sanitizer's stand-in)";
  }
  const platform::PageRange locked[] = {{p + 4 * kOs, kOs}, {p + 6 * kOs, kOs}};
  EXPECT_EQ(platform::decommit_all(locked, 2), 2u) << "the refused batch went range by range";
  EXPECT_TRUE(platform::decommit_all_batches());
  std::memset(p, 0x3c, 4 * kOs);
  const platform::PageRange again[] = {{p + 1 * kOs, kOs}, {p + 3 * kOs, kOs}};
  EXPECT_EQ(platform::decommit_all(again, 2), 1u) << "batching was turned off by the locked pages";
  ExpectDroppedPagesZero(p, kPages, [](std::size_t page) { return page == 1 || page == 3 || page == 4 || page == 6; });
  munlock(p + 4 * kOs, 4 * kOs);
  platform::unmap(p, kPages * kOs);
}

// Locked pages (mlock) cannot be dropped: the kernel refuses MADV_DONTNEED with EINVAL. They must
// still read as zeros after decommit and decommit_all, which every caller trusts (calloc skips
// its memset on pages it knows decommitted).
TEST(Platform, DecommittedLockedPagesReadAsZeros) {
  constexpr std::size_t kPages = 8;
  auto* p = static_cast<unsigned char*>(platform::map(kPages * kOs));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x3c, kPages * kOs);
  if (mlock(p, kPages * kOs) != 0) {
    platform::unmap(p, kPages * kOs);
    GTEST_SKIP() << "mlock refused (RLIMIT_MEMLOCK)";
  }
  errno = 4242;
  platform::decommit(p + kOs, 2 * kOs);
  const platform::PageRange ranges[] = {{p + 4 * kOs, kOs}, {p + 6 * kOs, kOs}};
  platform::decommit_all(ranges, 2);
  EXPECT_EQ(errno, 4242);
  ExpectDroppedPagesZero(p, kPages, [](std::size_t page) { return page == 1 || page == 2 || page == 4 || page == 6; });
  munlock(p, kPages * kOs);
  platform::unmap(p, kPages * kOs);
}

// The inode of a descriptor, or 0.
std::uint64_t InodeOf(int fd) {
  struct stat st;
  return fd >= 0 && fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

// This process's /proc/self/pagemap, opened afresh: its inode (each process has its own).
std::uint64_t OwnPagemapInode() {
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  const std::uint64_t ino = InodeOf(fd);
  if (fd >= 0) close(fd);
  return ino;
}

// A program may close every descriptor it did not open and get the number back for a file of its
// own: zero_pages must not read that file as pagemap (/dev/zero would call every page that
// mincore finds absent untouched, and a swapped-out page would keep its data), nor close it.
TEST(PlatformZeroPages, ADescriptorTheProgramReusedIsNeitherReadNorClosed) {
  if (!PagemapReadable()) GTEST_SKIP() << "/proc/self/pagemap cannot be read here";
  const int fd = platform::pagemap_descriptor_for_test();
  ASSERT_GE(fd, 0);
  const int zero = open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(zero, 0);
  ASSERT_EQ(dup2(zero, fd), fd);  // the program's /dev/zero now has pagemap's number
  close(zero);
  const int now = platform::pagemap_descriptor_for_test();
  EXPECT_NE(now, fd) << "the program's /dev/zero would be read as pagemap";
  EXPECT_EQ(InodeOf(now), OwnPagemapInode());
  char c = 1;
  EXPECT_EQ(read(fd, &c, 1), 1) << "the program's descriptor was closed";
  EXPECT_EQ(c, 0);
  close(fd);
}

// A fork child reads its own page tables: the descriptor it inherits reads its parent's.
TEST(PlatformZeroPages, AForkChildReadsItsOwnPagemap) {
  if (!PagemapReadable()) GTEST_SKIP() << "/proc/self/pagemap cannot be read here";
  ASSERT_GE(platform::pagemap_descriptor_for_test(), 0);  // the parent's, open
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(InodeOf(platform::pagemap_descriptor_for_test()) == OwnPagemapInode() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child would read its parent's page tables";
}

}  // namespace
}  // namespace brisk
