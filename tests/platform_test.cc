// Out of memory, injected through the platform layer: every entry point fails cleanly with
// ENOMEM, and blocks allocated before stay intact.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/platform.h"

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

}  // namespace
}  // namespace brisk
