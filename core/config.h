// Compile-time configuration: tier 1 of brisk's three configuration tiers (see README,
// "Configuration"). Every constant that shapes memory layout lives here; an invalid combination
// fails to compile.
#pragma once

#include <cstddef>
#include <cstdint>

namespace brisk {

// Every block is aligned to at least alignof(max_align_t) (glibc's tst-mallocalign1 checks it).
inline constexpr std::size_t kMinAlign = 16;

// Small and medium blocks live in chunks: 4 MiB, aligned to 4 MiB, so that the chunk holding a
// block is found by masking its address. A chunk is 64 pages of 64 KiB; page 0 holds the chunk
// header and the span descriptors, so metadata never shares a page with user data.
inline constexpr unsigned kChunkShift = 22;
inline constexpr std::size_t kChunkSize = std::size_t{1} << kChunkShift;
inline constexpr std::uintptr_t kChunkMask = kChunkSize - 1;
inline constexpr unsigned kPageShift = 16;
inline constexpr std::size_t kPageSize = std::size_t{1} << kPageShift;
inline constexpr unsigned kPagesPerChunk = kChunkSize / kPageSize;

// The unit of the OS (mmap, madvise granularity) on every supported Linux target.
inline constexpr std::size_t kOsPageSize = 4096;
// n rounded up to a whole number of OS pages.
constexpr std::uint64_t round_to_os_page(std::uint64_t n) { return (n + kOsPageSize - 1) & ~std::uint64_t{kOsPageSize - 1}; }

// Blocks up to kSmallMax come from size classes (many blocks per span); up to kMediumMax from a
// run of pages of their own inside a chunk, which realloc can grow in place; above that from the
// OS directly ("large"), page aligned, through a bounded cache.
inline constexpr std::size_t kSmallMax = 64 * 1024;
inline constexpr unsigned kMaxSmallSpanPages = 4;
inline constexpr std::size_t kMediumMax = 2 * 1024 * 1024;
// A block that realloc grows past this and must move becomes a large block even where a medium
// one would do, and a large block realloc shrinks stays large only above it (override/entry.cc
// has the measurements; debug/realloc.cc's realloc_in_place keeps the same bounds).
inline constexpr std::size_t kGrowLargeMin = 256 * 1024;

// User-space addresses on x86-64 and AArch64 (4-level tables) fit in 47 bits. One byte per
// 4 MiB region of that space says whether brisk owns the region: 32 MiB of zero-filled address
// space, of which only the bytes for regions in use are ever touched.
inline constexpr unsigned kAddressBits = 47;
inline constexpr std::size_t kRegionMapEntries = std::size_t{1} << (kAddressBits - kChunkShift);

// Remote frees are batched per destination heap: kRemoteSlots destinations at once, each sent
// with one atomic operation when it holds kRemoteBatch blocks (or on collision or collect).
inline constexpr unsigned kRemoteSlots = 8;
inline constexpr unsigned kRemoteBatch = 64;
// ... or when its blocks add up to BRISK_REMOTE_BATCH_BYTES (a strategy lever; this is its
// balanced value and a heap's value before it first reads the lever): a batch of medium blocks
// must not park megabytes in a thread that happens to free them (without the bound, the
// realloc-chain stress workload peaked at 423 MB RSS, against 48 MB under glibc).
inline constexpr std::size_t kRemoteBatchBytes = 256 * 1024;

// A thread keeps the current span of a class even when it empties, so alloc/free ping-pong
// stays on the fast path. One-page spans are always kept (at most 56 of them); of the larger
// ones (classes above 8 KiB, up to 256 KiB a span) only the BRISK_RETAINED_SPANS most recently
// emptied (a strategy lever, at most kRetainedLargeSpans), since empty spans kept are resident
// pages no purge reaches. For speed it must exceed the number of large classes a workload
// cycles through (MMtest's medium test cycles through 12), or each pass releases and recreates
// their spans.
inline constexpr unsigned kRetainedLargeSpans = 16;

// The most page runs of freed medium blocks a thread keeps for its next medium blocks (their
// bytes are bounded by BRISK_MEDIUM_CACHE_BYTES, a strategy lever). Searched linearly on every
// medium allocation.
inline constexpr unsigned kMediumCacheSlots = 8;

// Free-list links are stored XOR a secret per-block mask (core/free_key.h), and alloc_small
// checks each decoded link, so an overwritten link in a freed block cannot make malloc return
// an address of the writer's choice. It costs a multiply and a check per allocation: malloc
// 20 -> 30 instructions to its ret, and about 1 ns (+10%) per malloc+free pair on this
// project's VMs (README, "Bad input"). Set it to false to trade that protection for the time.
inline constexpr bool kEncodeFreeLinks = true;

static_assert(kRetainedLargeSpans > 0 && kRetainedLargeSpans < 256, "Heap keeps the count in a byte");
static_assert(kPagesPerChunk == 64, "the chunk's free-page set is one 64-bit word");
static_assert(kSmallMax <= kMaxSmallSpanPages * kPageSize / 4,
              "a span of the largest small class must hold at least 4 blocks (core/size_class.h)");
static_assert(kMediumMax <= kChunkSize - kPageSize, "a medium block must fit in one chunk");
static_assert(kSmallMax % kMinAlign == 0 && kPageSize % kOsPageSize == 0);
static_assert((kMinAlign & (kMinAlign - 1)) == 0);

}  // namespace brisk
