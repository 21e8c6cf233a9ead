// Bad pointers into debug memory, with BRISK_DEBUG_ACTION's "report" (the DebugMode fixture):
// each is reported and the program goes on, with every block intact and none handed out twice.
// The pointers are those a program gets wrong near a debug block: the start of the block it is
// carved from (the user pointer less the header and any alignment slack), and pointers into a
// large debug block; and calls on a freed or reported block.
#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "debug/block_layout.h"
#include "tests/debug_mode_fixture.h"
#include "tests/test_util.h"

namespace {

using brisk_test::Fill;
using brisk_test::Verify;

// The block a debug block is carved from: what a program passing a pointer to the header, or to
// the slack before it, passes.
char* UnderlyingOf(void* p) {
  auto* h = reinterpret_cast<const brisk::debug::Header*>(static_cast<char*>(p) - sizeof(brisk::debug::Header));
  return static_cast<char*>(p) - sizeof(brisk::debug::Header) - h->underlying_offset;
}

struct Shape {
  size_t size;
  size_t alignment;  // 0: brisk_malloc
};
// Small, medium and large blocks, with and without alignment slack.
const Shape kShapes[] = {{32, 0},       {100000, 0},    {8u << 20, 0},     {32, 64},
                         {100000, 4096}, {8u << 20, 65536}, {3000, 256}};

void* Make(const Shape& shape) {
  return shape.alignment == 0 ? brisk_malloc(shape.size) : brisk_aligned_alloc(shape.alignment, shape.size);
}

// The checked prefix of a block: its whole size up to 64 KiB (time under the sanitizers).
size_t Checked(size_t size) { return size < 65536 ? size : 65536; }

TEST_F(DebugMode, ACallOnTheBlockADebugBlockIsCarvedFromIsReportedAndTheBlockStaysLive) {
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(testing::Message() << shape.size << " bytes aligned to " << shape.alignment);
    void* p = Make(shape);
    ASSERT_NE(p, nullptr);
    Fill(p, Checked(shape.size), shape.size);
    char* u = UnderlyingOf(p);
    ASSERT_EQ(u == static_cast<char*>(p) - sizeof(brisk::debug::Header), shape.alignment == 0);
    const int reports = ReportCount();
    brisk_free(u);
    EXPECT_EQ(ReportCount(), reports + 1) << "a free of the underlying block was taken for a release block's";
    errno = 0;
    EXPECT_EQ(brisk_realloc(u, 64), nullptr);
    EXPECT_EQ(ReportCount(), reports + 2);
    EXPECT_EQ(brisk_usable_size(u), 0u);
    EXPECT_EQ(ReportCount(), reports + 3);
    EXPECT_NE(Reports().find("no debug block"), std::string::npos);
    // p was not freed under the debug block: no new block of its size is p, and p is intact.
    std::vector<void*> more;
    for (int i = 0; i < 8; ++i) {
      void* q = Make(shape);
      EXPECT_NE(q, p) << "a live block was handed out again";
      more.push_back(q);
    }
    EXPECT_TRUE(Verify(p, Checked(shape.size), shape.size));
    EXPECT_EQ(brisk_usable_size(p), shape.size);
    for (void* q : more) brisk_free(q);
    brisk_free(p);
    EXPECT_EQ(ReportCount(), reports + 3);
  }
  EXPECT_EQ(brisk_check_heap(), 0);
}

TEST_F(DebugMode, BadPointersIntoALargeDebugBlockAreReportedAndTheProgramGoesOn) {
  for (size_t alignment : {size_t{0}, size_t{65536}}) {
    SCOPED_TRACE(alignment);
    const Shape shape{8u << 20, alignment};
    char* p = static_cast<char*>(Make(shape));
    ASSERT_NE(p, nullptr);
    Fill(p, Checked(shape.size), 7);
    const int reports = ReportCount();
    int expected = reports;
    for (char* bad : {p + 16, p + 4096, p - 16, p + 1, p + 65536}) {
      brisk_free(bad);
      EXPECT_EQ(ReportCount(), ++expected) << "free(p + " << bad - p << ")";
      EXPECT_EQ(brisk_realloc(bad, 100), nullptr);
      EXPECT_EQ(ReportCount(), ++expected) << "realloc(p + " << bad - p << ")";
      EXPECT_EQ(brisk_usable_size(bad), 0u);
      EXPECT_EQ(ReportCount(), ++expected) << "malloc_usable_size(p + " << bad - p << ")";
    }
    EXPECT_TRUE(Verify(p, Checked(shape.size), 7));
    EXPECT_EQ(brisk_usable_size(p), shape.size);
    brisk_free(p);
    EXPECT_EQ(ReportCount(), expected);
  }
  EXPECT_EQ(brisk_check_heap(), 0);
}

// A release large block freed in debug mode is no debug memory (its first word is no debug
// block's mark): freed the release way, without a report.
TEST_F(DebugMode, AReleaseLargeBlockIsNoDebugMemory) {
  brisk_debug_exit();
  void* r = brisk_malloc(8u << 20);  // a release large block
  ASSERT_NE(r, nullptr);
  std::memset(r, 0x5A, 64);
  brisk_debug_enter();
  const int reports = ReportCount();
  EXPECT_GE(brisk_usable_size(r), size_t{8} << 20);
  brisk_free(r);
  EXPECT_EQ(ReportCount(), reports);
}

TEST_F(DebugMode, UsableSizeOfAFreedDebugBlockIsReported) {
  for (size_t size : {size_t{32}, size_t{100000}, size_t{8u << 20}}) {
    SCOPED_TRACE(size);
    void* p = brisk_malloc(size);
    ASSERT_NE(p, nullptr);
    brisk_free(p);  // into the quarantine (64 MiB under ctest)
    const int reports = ReportCount();
    EXPECT_EQ(brisk_usable_size(p), 0u);
    EXPECT_EQ(ReportCount(), reports + 1);
    EXPECT_NE(Reports().find("malloc_usable_size of a freed block"), std::string::npos);
  }
}

// realloc refuses a damaged block (NULL, the block kept and never reused); C lets the program
// free the block then, which is no double free.
TEST_F(DebugMode, AFreeOfABlockReallocRefusedIsNotCalledADoubleFree) {
  char* p = static_cast<char*>(brisk_malloc(32));
  ASSERT_NE(p, nullptr);
  reinterpret_cast<volatile char*>(p)[32] = '!';  // into the canary
  EXPECT_EQ(brisk_realloc(p, 64), nullptr);
  const int reports = ReportCount();
  EXPECT_NE(Reports().find("overrun"), std::string::npos);
  brisk_free(p);
  EXPECT_EQ(ReportCount(), reports + 1);
  const std::string last = Reports();
  EXPECT_NE(last.find("kept after an earlier report"), std::string::npos);
  EXPECT_EQ(last.find("double free"), std::string::npos);
}

// Size 0 is a size: free_sized(p, 0) of a 40-byte block is wrong, of a malloc(0) block right.
TEST_F(DebugMode, ASizedFreeOfSizeZeroIsChecked) {
  void* p = brisk_malloc(40);
  void* empty = brisk_malloc(0);
  ASSERT_TRUE(p != nullptr && empty != nullptr);
  const int reports = ReportCount();
  brisk_free_sized(empty, 0);
  EXPECT_EQ(ReportCount(), reports);
  brisk_free_sized(p, 0);
  EXPECT_EQ(ReportCount(), reports + 1);
  EXPECT_NE(Reports().find("sized free with a size that is not the block's"), std::string::npos);
}

}  // namespace
