// Properties of the brisk_* C API and brisk::allocator, checked from outside: every size from 0
// to past the medium classes and a sweep of large ones, every power-of-two alignment to 1 MiB,
// realloc keeping contents across size classes, calloc zeroing of reused memory, usable size,
// and every errno case of the README's "Bad input" table.
#include <brisk/brisk.h>
#include <brisk/brisk.hpp>

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace {

using brisk_test::FirstMismatch;
using brisk_test::FirstNonZero;
using brisk_test::Fill;
using brisk_test::IsAligned;
using brisk_test::kScale;

constexpr size_t kMinAlign = alignof(std::max_align_t);  // 16 on x86-64
static_assert(kMinAlign >= 16);

// Sizes are passed through a volatile so the compiler cannot fold or drop allocation calls.
size_t Opaque(size_t n) {
  volatile size_t v = n;
  return v;
}

struct Block {
  char* p;
  size_t size;
  uint64_t seed;
};

// Fails if any two live blocks overlap (each block counted with its usable size).
void ExpectDisjoint(std::vector<Block> blocks) {
  std::sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.p < b.p; });
  for (size_t i = 1; i < blocks.size(); ++i) {
    size_t prev_usable = brisk_usable_size(blocks[i - 1].p);
    ASSERT_LE(reinterpret_cast<uintptr_t>(blocks[i - 1].p) + prev_usable,
              reinterpret_cast<uintptr_t>(blocks[i].p))
        << "blocks " << static_cast<void*>(blocks[i - 1].p) << " (usable " << prev_usable << ") and "
        << static_cast<void*>(blocks[i].p) << " overlap";
  }
}

// Checks one fresh block: non-null, aligned, usable >= size, and writable and readable over its
// whole usable size.
void CheckFreshBlock(void* p, size_t size, size_t alignment, uint64_t seed) {
  ASSERT_NE(p, nullptr) << "size " << size << " alignment " << alignment;
  ASSERT_TRUE(IsAligned(p, alignment)) << p << " size " << size << " alignment " << alignment;
  size_t usable = brisk_usable_size(p);
  ASSERT_GE(usable, size) << p;
  Fill(p, usable, seed);
  ASSERT_EQ(FirstMismatch(p, usable, seed), SIZE_MAX) << p << " size " << size;
}

TEST(BriskApi, EverySmallAndMediumSize) {
  // Every size from 0 to 4 KiB, then every 13th (13 is odd, so all residues mod 16 still
  // occur) to past 64 KiB. A window of the last blocks stays live so neighbouring
  // blocks of the same class must not overlap and must keep their contents.
  constexpr size_t kMax = 70000;
  constexpr size_t kWindow = 64;
  std::vector<Block> live;
  for (size_t size = 0; size <= kMax; size += (size < 4096 ? 1 : 13 * kScale)) {
    void* p = brisk_malloc(Opaque(size));
    ASSERT_NE(p, nullptr) << "brisk_malloc(" << size << ")";
    ASSERT_TRUE(IsAligned(p, kMinAlign)) << p << " size " << size;
    size_t usable = brisk_usable_size(p);
    ASSERT_GE(usable, size) << p;
    Fill(p, usable, size);
    live.push_back({static_cast<char*>(p), usable, size});
    if (live.size() == kWindow) {
      ExpectDisjoint(live);
      for (const Block& b : live) {
        ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX)
            << "block " << static_cast<void*>(b.p) << " of usable size " << b.size << " was overwritten";
        brisk_free(b.p);
      }
      live.clear();
    }
  }
  for (const Block& b : live) {
    ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX);
    brisk_free(b.p);
  }
}

TEST(BriskApi, ZeroSizeGivesDistinctFreeableBlocks) {
  void* a = brisk_malloc(Opaque(0));
  void* b = brisk_malloc(Opaque(0));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  brisk_free(a);
  brisk_free(b);
}

TEST(BriskApi, LargeSizeSweep) {
  // Powers of two and their neighbours from 64 KiB to 64 MiB (4 MiB under sanitizers), written and verified over the
  // whole usable size, with a few blocks live at once.
  const size_t kLargest = (size_t{64} << 20) / (kScale * kScale);  // 4 MiB under sanitizers
  std::vector<size_t> sizes;
  for (size_t s = size_t{64} << 10; s <= kLargest; s *= 2) {
    for (size_t v : {s - 1, s, s + 1, s + s / 2, s + 4096 + 7}) {
      if (v <= kLargest) sizes.push_back(v);
    }
  }
  std::vector<Block> live;
  uint64_t seed = 1;
  for (size_t size : sizes) {
    void* p = brisk_malloc(Opaque(size));
    ASSERT_NO_FATAL_FAILURE(CheckFreshBlock(p, size, kMinAlign, seed));
    live.push_back({static_cast<char*>(p), brisk_usable_size(p), seed++});
    if (live.size() == 4) {
      ExpectDisjoint(live);
      for (const Block& b : live) {
        ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX) << static_cast<void*>(b.p);
        brisk_free(b.p);
      }
      live.clear();
    }
  }
  for (const Block& b : live) {
    ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX);
    brisk_free(b.p);
  }
}

TEST(BriskApi, AlignedAllocEveryPowerOfTwo) {
  // Every power of two from 1 to 1 MiB, with sizes below, at and above the alignment; all
  // blocks of one alignment stay live together and are checked for overlap.
  uint64_t seed = 100;
  for (size_t alignment = 1; alignment <= (size_t{1} << 20); alignment *= 2) {
    std::vector<Block> live;
    std::vector<size_t> sizes = {1, 8, 16, 24, 100, 4096, 40000};
    for (size_t k : {alignment - 1, alignment, alignment + 1, 3 * alignment}) sizes.push_back(k);
    for (size_t size : sizes) {
      if (size == 0) size = 1;
      for (int rep = 0; rep < 3; ++rep) {
        void* p = brisk_aligned_alloc(Opaque(alignment), Opaque(size));
        // Alignments below max_align_t still get at least max_align_t from malloc-like paths;
        // only the requested alignment is promised.
        ASSERT_NO_FATAL_FAILURE(CheckFreshBlock(p, size, alignment, seed));
        EXPECT_TRUE(IsAligned(p, std::min(alignment, kMinAlign)));
        live.push_back({static_cast<char*>(p), brisk_usable_size(p), seed++});
      }
    }
    ExpectDisjoint(live);
    for (const Block& b : live) {
      ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX)
          << "alignment " << alignment << " block " << static_cast<void*>(b.p);
      brisk_free(b.p);
    }
  }
}

// Reallocs p through the given sizes, checking that the common prefix survives every step.
void ReallocChain(const std::vector<size_t>& sizes, uint64_t seed) {
  size_t size = sizes[0];
  char* p = static_cast<char*>(brisk_malloc(Opaque(size)));
  ASSERT_NE(p, nullptr);
  Fill(p, size, seed);
  for (size_t i = 1; i < sizes.size(); ++i) {
    size_t next = sizes[i];
    char* q = static_cast<char*>(brisk_realloc(p, Opaque(next)));
    ASSERT_NE(q, nullptr) << "realloc " << size << " -> " << next;
    ASSERT_TRUE(IsAligned(q, kMinAlign)) << q;
    ASSERT_GE(brisk_usable_size(q), next);
    size_t kept = std::min(size, next);
    ASSERT_EQ(FirstMismatch(q, kept, seed), SIZE_MAX) << "realloc " << size << " -> " << next
                                                      << " lost contents";
    // Refill the whole new size so the next step checks fresh bytes past the old end too.
    seed = seed * 31 + 7;
    Fill(q, next, seed);
    p = q;
    size = next;
  }
  brisk_free(p);
}

TEST(BriskApi, ReallocKeepsContents) {
  // small -> small, growing and shrinking within and across classes
  ReallocChain({1, 2, 15, 16, 17, 31, 48, 64, 100, 128, 129, 255, 256, 100, 17, 3}, 1);
  // small -> medium -> large -> and back down
  ReallocChain({24, 1000, 5000, 33000, 70000, 300000, size_t{3} << 20, size_t{9} << 20, 500000, 40000,
                3000, 200, 8},
               2);
  // large -> larger -> smaller, staying large
  ReallocChain({size_t{2} << 20, (size_t{2} << 20) + 1, size_t{16} << 20, size_t{5} << 20, size_t{1} << 20}, 3);
  // the same size again, and sizes just around the usable size
  void* p = brisk_malloc(Opaque(40));
  ASSERT_NE(p, nullptr);
  size_t usable = brisk_usable_size(p);
  ReallocChain({40, 40, usable, usable + 1, usable, 40}, 4);
  brisk_free(p);
}

// A medium block (64 KiB to 2 MiB) offers its request rounded to 16 bytes, not its 64 KiB
// pages: a realloc that moves it copies that many bytes. Resizing within its pages keeps the
// block in place and changes only the usable size.
TEST(BriskApi, MediumUsableSizeIsTheRequest) {
  constexpr size_t kPage = 64 << 10;
  char* p = static_cast<char*>(brisk_malloc(Opaque(70001)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(brisk_usable_size(p), 70016u);
  Fill(p, 70001, 5);
  char* q = static_cast<char*>(brisk_realloc(p, Opaque(2 * kPage - 8)));  // the same two pages
  ASSERT_EQ(q, p) << "a resize within the block's pages stays in place";
  EXPECT_EQ(brisk_usable_size(q), 2 * kPage);
  ASSERT_EQ(FirstMismatch(q, 70001, 5), SIZE_MAX);
  Fill(q, 2 * kPage, 6);
  q = static_cast<char*>(brisk_realloc(q, Opaque(kPage + 100)));
  ASSERT_EQ(q, p);
  EXPECT_EQ(brisk_usable_size(q), kPage + 112);
  ASSERT_EQ(FirstMismatch(q, kPage + 100, 6), SIZE_MAX);
  brisk_free(q);
}

TEST(BriskApi, ReallocNullAllocates) {
  void* p = brisk_realloc(nullptr, Opaque(100));
  ASSERT_NO_FATAL_FAILURE(CheckFreshBlock(p, 100, kMinAlign, 9));
  brisk_free(p);
}

TEST(BriskApi, ReallocManyRandomSteps) {
  brisk_test::Rng rng(77);
  constexpr int kBlocks = 32;
  std::vector<Block> blocks(kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    size_t s = brisk_test::MixedSize(rng);
    blocks[i] = {static_cast<char*>(brisk_malloc(s)), s, rng.Next()};
    ASSERT_NE(blocks[i].p, nullptr);
    Fill(blocks[i].p, s, blocks[i].seed);
  }
  for (int step = 0; step < 4000 / kScale; ++step) {
    Block& b = blocks[rng.Below(kBlocks)];
    size_t next = brisk_test::MixedSize(rng);
    char* q = static_cast<char*>(brisk_realloc(b.p, next));
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(FirstMismatch(q, std::min(b.size, next), b.seed), SIZE_MAX)
        << "step " << step << " realloc " << b.size << " -> " << next;
    b = {q, next, rng.Next()};
    Fill(q, next, b.seed);
  }
  for (const Block& b : blocks) {
    ASSERT_EQ(FirstMismatch(b.p, b.size, b.seed), SIZE_MAX);
    brisk_free(b.p);
  }
}

// calloc of a medium or large block hands out its first and last pages present (written, not
// the kernel's shared zero page, which a read would map and the first write copy with a TLB
// shootdown), and leaves the pages between untouched. After brisk_trim every free page is given
// back, so the blocks come from pages no one has touched since.
TEST(BriskApi, CallocOfABigBlockHasItsEdgesPresentAndNothingElse) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bool huge_always = false;
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
    char mode[128] = {};
    huge_always = std::fgets(mode, sizeof mode, f) != nullptr && std::strstr(mode, "[always]") != nullptr;
    std::fclose(f);
  }
  for (size_t size : {size_t{200} << 10, size_t{12} << 20}) {  // a medium block, a large one
    brisk_trim();
    auto* p = static_cast<unsigned char*>(brisk_calloc(1, Opaque(size)));
    ASSERT_NE(p, nullptr);
    auto present = [&](size_t offset) {
      unsigned char v = 0;
      const auto at = reinterpret_cast<uintptr_t>(p + offset) & ~(page - 1);
      EXPECT_EQ(mincore(reinterpret_cast<void*>(at), page, &v), 0);
      return (v & 1) != 0;
    };
    EXPECT_TRUE(present(0)) << size << " bytes: the first page";
    EXPECT_TRUE(present(size - 1)) << size << " bytes: the last page";
    // (Unless the kernel backs any touch with a huge page: transparent_hugepage set to always.)
    if (!huge_always) {
      EXPECT_FALSE(present(size / 2)) << size << " bytes: a page between, touched by no one";
    }
    EXPECT_EQ(FirstNonZero(p, size), SIZE_MAX);
    brisk_free(p);
  }
}

TEST(BriskApi, CallocZeroesFreshAndReusedMemory) {
  auto CopiesOf = [](size_t s) { return s > (size_t{1} << 20) ? 2 : 8; };
  const std::vector<size_t> sizes = {1,     7,      16,     48,     100,     1000,     4096,
                                     5000,  40000,  70000,  300000, 1 << 20, 3 << 20, kScale == 1 ? 17 << 20 : 5 << 20};
  for (int round = 0; round < 3; ++round) {
    // Dirty memory of every size, free it, then calloc the same sizes: reuse must be zeroed.
    std::vector<void*> dirty;
    for (size_t s : sizes) {
      for (int i = 0; i < CopiesOf(s); ++i) {
        void* p = brisk_malloc(s);
        ASSERT_NE(p, nullptr);
        std::memset(p, 0xA5, brisk_usable_size(p));
        dirty.push_back(p);
      }
    }
    for (void* p : dirty) brisk_free(p);
    std::vector<void*> zeroed;
    for (size_t s : sizes) {
      for (int i = 0; i < CopiesOf(s); ++i) {
        // count x size split several ways
        size_t count = (i % 2 == 0) ? 1 : s;
        size_t each = (i % 2 == 0) ? s : 1;
        void* p = brisk_calloc(Opaque(count), Opaque(each));
        ASSERT_NE(p, nullptr) << "calloc(" << count << ", " << each << ")";
        ASSERT_TRUE(IsAligned(p, kMinAlign));
        ASSERT_GE(brisk_usable_size(p), s);
        ASSERT_EQ(FirstNonZero(p, s), SIZE_MAX) << "calloc of " << s << " bytes not zeroed (round "
                                                << round << ")";
        std::memset(p, 0x5A, s);  // dirty it for the next round
        zeroed.push_back(p);
      }
    }
    for (void* p : zeroed) brisk_free(p);
  }
  void* z = brisk_calloc(Opaque(0), Opaque(16));
  ASSERT_NE(z, nullptr);
  brisk_free(z);
}

TEST(BriskApi, UsableSizeOfNullIsZero) { EXPECT_EQ(brisk_usable_size(nullptr), 0u); }

TEST(BriskApi, FreeNullIsNoOp) {
  brisk_free(nullptr);
  brisk_free_sized(nullptr, 0);
}

TEST(BriskApi, FreeSized) {
  // brisk_free_sized with the requested size, and with any size up to the usable size, for
  // small, medium and large blocks; the memory must be usable afterwards.
  for (size_t s : {size_t{1}, size_t{16}, size_t{33}, size_t{500}, size_t{4000}, size_t{70000},
                   size_t{1} << 20, size_t{5} << 20}) {
    for (int variant = 0; variant < 3; ++variant) {
      void* p = brisk_malloc(Opaque(s));
      ASSERT_NO_FATAL_FAILURE(CheckFreshBlock(p, s, kMinAlign, s + variant));
      size_t usable = brisk_usable_size(p);
      size_t told = variant == 0 ? s : variant == 1 ? usable : s + (usable - s) / 2;
      brisk_free_sized(p, told);
    }
  }
  // Interleaved with plain frees in one class.
  std::vector<void*> v;
  for (int i = 0; i < 1000; ++i) v.push_back(brisk_malloc(64));
  for (int i = 0; i < 1000; ++i) {
    if (i % 2) brisk_free_sized(v[i], 64);
    else brisk_free(v[i]);
  }
}

// ---- errno cases ----------------------------------------------------------------------------

TEST(BriskErrno, MallocTooLarge) {
  for (size_t s : {SIZE_MAX, SIZE_MAX - 4096, size_t{PTRDIFF_MAX} + 1, size_t{PTRDIFF_MAX}}) {
    errno = 0;
    void* p = brisk_malloc(Opaque(s));
    EXPECT_EQ(p, nullptr) << "brisk_malloc(" << s << ")";
    EXPECT_EQ(errno, ENOMEM) << "brisk_malloc(" << s << ")";
    if (p) brisk_free(p);
  }
}

TEST(BriskErrno, CallocOverflow) {
  const std::pair<size_t, size_t> cases[] = {
      {SIZE_MAX, 2}, {2, SIZE_MAX}, {size_t{1} << 32, size_t{1} << 32}, {(SIZE_MAX / 16) + 1, 16},
      {size_t{PTRDIFF_MAX} / 2 + 1, 2}, {SIZE_MAX, SIZE_MAX}};
  for (auto [n, m] : cases) {
    errno = 0;
    void* p = brisk_calloc(Opaque(n), Opaque(m));
    EXPECT_EQ(p, nullptr) << "brisk_calloc(" << n << ", " << m << ")";
    EXPECT_EQ(errno, ENOMEM) << "brisk_calloc(" << n << ", " << m << ")";
    if (p) brisk_free(p);
  }
}

TEST(BriskErrno, ReallocTooLargeKeepsBlock) {
  for (size_t start : {size_t{40}, size_t{5000}, size_t{200000}, size_t{3} << 20}) {
    char* p = static_cast<char*>(brisk_malloc(start));
    ASSERT_NE(p, nullptr);
    Fill(p, start, start);
    for (size_t s : {SIZE_MAX, size_t{PTRDIFF_MAX} + 1}) {
      errno = 0;
      void* q = brisk_realloc(p, Opaque(s));
      EXPECT_EQ(q, nullptr) << "brisk_realloc(p, " << s << ")";
      EXPECT_EQ(errno, ENOMEM);
      ASSERT_EQ(FirstMismatch(p, start, start), SIZE_MAX) << "failed realloc damaged the block";
      ASSERT_GE(brisk_usable_size(p), start);
    }
    // The block is still live and ordinary: it can grow and be freed.
    char* q = static_cast<char*>(brisk_realloc(p, start * 2));
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(FirstMismatch(q, start, start), SIZE_MAX);
    brisk_free(q);
  }
}

TEST(BriskErrno, AlignedAllocBadAlignment) {
  for (size_t alignment : {size_t{0}, size_t{3}, size_t{24}, size_t{48}, size_t{100}, size_t{4097},
                           SIZE_MAX, (size_t{1} << 20) + (size_t{1} << 19)}) {
    errno = 0;
    void* p = brisk_aligned_alloc(Opaque(alignment), Opaque(64));
    EXPECT_EQ(p, nullptr) << "brisk_aligned_alloc(" << alignment << ", 64)";
    EXPECT_EQ(errno, EINVAL) << "brisk_aligned_alloc(" << alignment << ", 64)";
    if (p) brisk_free(p);
  }
}

TEST(BriskErrno, AlignedAllocTooLarge) {
  for (size_t s : {SIZE_MAX, size_t{PTRDIFF_MAX} + 1}) {
    errno = 0;
    void* p = brisk_aligned_alloc(Opaque(64), Opaque(s));
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(errno, ENOMEM) << "brisk_aligned_alloc(64, " << s << ")";
    if (p) brisk_free(p);
  }
}

// More than the machine's RAM and swap together: the kernel's overcommit heuristic (the default,
// vm.overcommit_memory=0) refuses such a mapping, and the call fails as glibc's does. Before,
// brisk mapped with MAP_NORESERVE, which skips the heuristic, and malloc(16 TiB) returned a
// pointer.
TEST(BriskErrno, MoreThanTheMachineHoldsFailsWithEnomem) {
  FILE* f = std::fopen("/proc/sys/vm/overcommit_memory", "r");
  int mode = -1;
  if (f != nullptr) {
    if (std::fscanf(f, "%d", &mode) != 1) mode = -1;
    std::fclose(f);
  }
  if (mode != 0 && mode != 2) GTEST_SKIP() << "vm.overcommit_memory is " << mode << ": the kernel maps any size";
  struct sysinfo si;
  ASSERT_EQ(sysinfo(&si), 0);
  const unsigned __int128 machine =
      (static_cast<unsigned __int128>(si.totalram) + si.totalswap) * (si.mem_unit == 0 ? 1 : si.mem_unit);
  if (machine * 2 >= size_t{1} << 46) GTEST_SKIP() << "a machine of more than 32 TiB";
  const size_t size = static_cast<size_t>(machine * 2);
  errno = 0;
  void* p = brisk_malloc(Opaque(size));
  EXPECT_EQ(p, nullptr) << "brisk_malloc(" << size << ")";
  EXPECT_EQ(errno, ENOMEM);
  if (p) brisk_free(p);
  errno = 0;
  p = brisk_calloc(Opaque(1), Opaque(size));
  EXPECT_EQ(p, nullptr) << "brisk_calloc(1, " << size << ")";
  EXPECT_EQ(errno, ENOMEM);
  if (p) brisk_free(p);
  errno = 0;
  p = brisk_aligned_alloc(Opaque(size_t{1} << 20), Opaque(size));
  EXPECT_EQ(p, nullptr) << "brisk_aligned_alloc(1 MiB, " << size << ")";
  EXPECT_EQ(errno, ENOMEM);
  if (p) brisk_free(p);
  for (size_t start : {size_t{40}, size_t{3} << 20}) {
    char* q = static_cast<char*>(brisk_malloc(start));
    ASSERT_NE(q, nullptr);
    Fill(q, start, start);
    errno = 0;
    void* r = brisk_realloc(q, Opaque(size));
    EXPECT_EQ(r, nullptr) << "brisk_realloc(" << start << " bytes, " << size << ")";
    EXPECT_EQ(errno, ENOMEM);
    if (r != nullptr) {
      brisk_free(r);
    } else {
      EXPECT_EQ(FirstMismatch(q, start, start), SIZE_MAX) << "the failed realloc damaged the block";
      brisk_free(q);
    }
  }
}

// Under a limit on address space (RLIMIT_AS; the commit limit of vm.overcommit_memory=2 and
// vm.max_map_count fail mappings the same way), mappings brisk keeps cached after their blocks
// were freed are given back before an allocation fails: a big block after big ones were freed,
// then small blocks (new chunks) after that one was freed, then the big block again after the
// small ones were freed (their emptied chunks, which the thread's heap keeps, go back through a
// trim). Before, each failed with ENOMEM while brisk held the room. In a child process, which the
// limit cannot outlive.
TEST(BriskErrno, FreedMappingsMakeRoomBeforeAnAllocationFails) {
  constexpr size_t kMiB = size_t{1} << 20;
  const int code = brisk_test::ExitStatusUnderAddressLimit(512 * kMiB, [] {
    void* big[4];
    for (void*& b : big) {
      b = brisk_malloc(32 * kMiB);
      if (b == nullptr) return 12;  // 128 MiB (in at most 256 MiB of mappings) fit under the limit
      static_cast<char*>(b)[0] = 1;
    }
    for (void* b : big) brisk_free(b);
    char* whole = static_cast<char*>(brisk_malloc(400 * kMiB));
    if (whole == nullptr) return 13;  // needs the room the cache held
    whole[400 * kMiB - 1] = 1;
    brisk_free(whole);
    std::vector<void*> small;
    small.reserve(16384);
    for (size_t i = 0; i < 200 * kMiB / (16 << 10); ++i) {
      void* b = brisk_malloc(16 << 10);  // small blocks: new chunks, 200 MiB of them
      if (b == nullptr) return 14;
      small.push_back(b);
    }
    for (void* b : small) brisk_free(b);
    whole = static_cast<char*>(brisk_malloc(400 * kMiB));
    if (whole == nullptr) return 15;  // needs the chunks the small blocks emptied
    brisk_free(whole);
    return 0;
  });
  ASSERT_GE(code, 0) << "the child died";
  EXPECT_NE(code, 13) << "a 400 MiB block failed while the freed 32 MiB blocks' mappings were cached";
  EXPECT_NE(code, 14) << "new chunks failed while the freed 400 MiB mapping was cached";
  EXPECT_NE(code, 15) << "a 400 MiB block failed while the thread's heap kept the chunks its frees emptied";
  EXPECT_EQ(code, 0) << "10: no VmSize; 11: setrlimit refused; 12: four 32 MiB blocks did not fit";
}

// ---- brisk::allocator ------------------------------------------------------------------------

TEST(BriskAllocator, VectorOfInts) {
  std::vector<int, brisk::allocator<int>> v;
  const int n = 200000 / kScale;
  for (int i = 0; i < n; ++i) v.push_back(i * 7 + 1);
  ASSERT_GE(brisk_usable_size(v.data()), v.capacity() * sizeof(int)) << "vector storage is not a brisk block";
  for (int i = 0; i < n; ++i) ASSERT_EQ(v[i], i * 7 + 1);
  v.resize(10);
  v.shrink_to_fit();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(v[i], i * 7 + 1);
}

TEST(BriskAllocator, MapOfStrings) {
  using Str = std::basic_string<char, std::char_traits<char>, brisk::allocator<char>>;
  std::map<int, Str, std::less<int>, brisk::allocator<std::pair<const int, Str>>> m;
  const int n = 20000 / kScale;
  for (int i = 0; i < n; ++i) m.emplace(i, Str(static_cast<size_t>(i % 200), static_cast<char>('a' + i % 26)));
  for (int i = 0; i < n; i += 2) m.erase(i);
  ASSERT_EQ(m.size(), static_cast<size_t>(n / 2));
  for (auto& [k, s] : m) {
    ASSERT_EQ(k % 2, 1);
    ASSERT_EQ(s.size(), static_cast<size_t>(k % 200));
    for (char c : s) ASSERT_EQ(c, static_cast<char>('a' + k % 26));
  }
}

struct alignas(256) OverAligned {
  unsigned char bytes[256];
};

TEST(BriskAllocator, OverAlignedType) {
  std::vector<OverAligned, brisk::allocator<OverAligned>> v;
  for (int i = 0; i < 300; ++i) {
    OverAligned o;
    std::memset(o.bytes, i & 0xff, sizeof o.bytes);
    v.push_back(o);
    ASSERT_TRUE(IsAligned(v.data(), alignof(OverAligned))) << static_cast<void*>(v.data());
  }
  for (int i = 0; i < 300; ++i)
    for (unsigned char b : v[i].bytes) ASSERT_EQ(b, i & 0xff);
}

TEST(BriskAllocator, TooManyElementsThrows) {
  brisk::allocator<uint64_t> a;
  EXPECT_THROW((void)a.allocate(SIZE_MAX / 4), std::bad_alloc);  // bad_array_new_length
  EXPECT_THROW((void)a.allocate(size_t{PTRDIFF_MAX} / 8 + 1), std::bad_alloc);
  EXPECT_TRUE(brisk::allocator<int>() == brisk::allocator<long>());
}

}  // namespace
