// Size classes for small blocks (<= kSmallMax).
//
// The table: 16-byte steps up to 128 B (the 16-byte alignment rule forbids finer steps), then
// eight classes per doubling, so internal waste above 128 B is at most 1/8 = 12.5% of the block
// (between 64 and 128 B it is bounded by the 16-byte step: at most 15 bytes, 18.75% at 65 B).
// Every class size is a multiple of 16, and spans start page-aligned, so every block is
// 16-byte aligned; a class whose size is a multiple of 2^k serves alignment 2^k.
//
// Each class has a span of 1 or 2 pages of 64 KiB: the fewest that hold at least 8 blocks, and
// one page for classes above 16 KiB, which holds 1-3 of their blocks. A thread keeps a span
// per class it uses, and a span of those classes often holds one live block: at 4 blocks (2-4
// pages) they claimed 128-256 KiB for it. One page instead (with a new span taking the page of
// one kept for a class the thread left, span_pages.cc) lowered the peaks of strings 19.4 ->
// 15.0 MiB, mstress 22.1 -> 20.0, realloc 100.3 -> 94.5, larson 47.7 -> 45.1 and xmalloc 15.5
// -> 13.3, at 0.84-0.98 of the time there and level elsewhere (both suites, 7 pairs, AMD VM,
// 2026-12-04). The 8-16 KiB classes keep 2-page spans: one page for them too lowered churn's
// and realloc's peaks 3-5% more, but would leave no class with a multi-page span for
// BRISK_RETAINED_* to keep.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/config.h"
#include "core/hints.h"
#include "core/span.h"

namespace brisk {

inline constexpr unsigned kNumClasses = 8 + 8 * 9;  // 16..128 by 16, then 8 per doubling to 64 KiB

constexpr std::size_t class_size_of(unsigned c) {
  if (c < 8) return (c + 1) * 16;
  unsigned k = 7 + (c - 8) / 8;   // size is in (2^k, 2^(k+1)]
  unsigned sub = 8 + (c - 8) % 8; // 9..16 eighths of 2^k
  return static_cast<std::size_t>(sub + 1) << (k - 3);
}

// Precondition: 1 <= size <= kSmallMax.
constexpr unsigned size_to_class_compute(std::size_t size) {
  if (size <= 128) return static_cast<unsigned>((size - 1) >> 4);
  unsigned k = 63u - static_cast<unsigned>(__builtin_clzll(size - 1));  // 2^k < size <= 2^(k+1)
  unsigned sub = static_cast<unsigned>((size - 1) >> (k - 3));             // 8..15
  return 8 + (k - 7) * 8 + (sub - 8);
}

struct SizeClassInfo {
  std::uint32_t size;
  std::uint32_t span_pages;
  std::uint32_t capacity;    // blocks per span
  BlockDivisor divisor;      // the span's block-start test (Span::is_carved_block)
};

constexpr SizeClassInfo make_class_info(unsigned c) {
  std::size_t size = class_size_of(c);
  unsigned pages = 1;
  const std::size_t min_blocks = size > 16 * 1024 ? 1 : 8;
  while (pages < kMaxSmallSpanPages && pages * kPageSize / size < min_blocks) pages *= 2;
  return SizeClassInfo{static_cast<std::uint32_t>(size), pages,
                       static_cast<std::uint32_t>(pages * kPageSize / size), block_divisor(size)};
}

constexpr std::array<SizeClassInfo, kNumClasses> make_class_table() {
  std::array<SizeClassInfo, kNumClasses> t{};
  for (unsigned c = 0; c < kNumClasses; ++c) t[c] = make_class_info(c);
  return t;
}

inline constexpr std::array<SizeClassInfo, kNumClasses> kClasses = make_class_table();

// (size + 15) / 16 -> class, for size <= 1024: one load instead of a bit scan.
inline constexpr unsigned kLookupMax = 1024;
constexpr std::array<std::uint8_t, kLookupMax / 16 + 1> make_lookup() {
  std::array<std::uint8_t, kLookupMax / 16 + 1> t{};
  for (unsigned i = 0; i <= kLookupMax / 16; ++i)
    t[i] = static_cast<std::uint8_t>(size_to_class_compute(i == 0 ? 1 : i * 16));
  return t;
}
inline constexpr auto kClassLookup = make_lookup();

// Precondition: size <= kSmallMax. Size 0 maps to the 16-byte class.
BRISK_ALWAYS_INLINE unsigned size_to_class(std::size_t size) {
  if (BRISK_LIKELY(size <= kLookupMax)) return kClassLookup[(size + 15) >> 4];
  return size_to_class_compute(size);
}

// Whether a block of `size` bytes stays in a small block of `usable` bytes when realloc resizes
// it: it fits and uses more than half of it (a shrink past half moves to a smaller class). The
// entry layer's realloc and debug mode's (debug/realloc.cc, realloc_in_place) keep to it.
BRISK_ALWAYS_INLINE bool stays_in_small_block(std::size_t size, std::size_t usable) {
  return size <= usable && size > usable / 2;
}

static_assert(class_size_of(kNumClasses - 1) == kSmallMax);
static_assert(size_to_class_compute(kSmallMax) == kNumClasses - 1);
static_assert(size_to_class_compute(129) == 8 && class_size_of(8) == 144);
static_assert(size_to_class_compute(256) == 15 && class_size_of(15) == 256);
static_assert(size_to_class_compute(257) == 16 && class_size_of(16) == 288);
static_assert(kNumClasses < 256, "span descriptors store the class in a byte");
constexpr bool spans_hold_enough_blocks() {
  for (const SizeClassInfo& info : kClasses)
    if (info.capacity < (info.size > 16 * 1024 ? 1u : 8u)) return false;
  return true;
}
static_assert(spans_hold_enough_blocks(), "kMaxSmallSpanPages is too small for kSmallMax");

}  // namespace brisk
