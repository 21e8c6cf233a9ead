// Fill patterns of debug blocks: fill a block with one byte, and check that it still holds it.
//
// Interface for the debug layer's integration:
//   fill_block(p, n, byte)              memset, named for what it is (inline stores up to 64 B)
//   find_fill_damage(p, n, byte)        offset of the first byte != byte, or n when intact.
//                                       The fast check, run at memory bandwidth (inline).
//   check_fill(p, n, byte, &damage)     true when intact; otherwise fills `damage` with the first
//                                       damaged offset and every damaged range, offset+length, up
//                                       to kMaxDamagedRanges (and says whether there were more).
//                                       Costs find_fill_damage when intact: ranges are collected
//                                       only after a mismatch.
//   fill_check_init()                   chooses the implementation for this CPU. Optional: the
//                                       first check does it too. Call it at debug-mode start.
//
// The check is a wide compare chosen once per process by CPU dispatch: AVX-512 (with BW),
// AVX2, SSE2, or a portable 8-bytes-per-word loop. Every implementation reads only the bytes
// of [p, p+n) (overlapping loads at the ends, masked loads for AVX-512), so a block that ends
// at an unmapped page is safe. Nothing here allocates, locks or calls the OS; any thread may
// call any function at any time.
//
// The *_with(impl, ...) forms run one implementation directly, for tests and the benchmark.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/hints.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace brisk::debug {

inline constexpr int kMaxDamagedRanges = 32;

struct DamagedRange {
  std::size_t offset;
  std::size_t length;
};

struct FillDamage {
  std::size_t first_offset;  // offset of the first damaged byte (== ranges[0].offset)
  int range_count;           // ranges filled in, at most kMaxDamagedRanges
  bool more_ranges;          // damage continued past the last range recorded
  DamagedRange ranges[kMaxDamagedRanges];
};

enum class FillCheckImpl : int { kPortable, kSse2, kAvx2, kAvx512, kCount };

// Blocks of up to kInlineCheckMax bytes are checked inline, without the dispatch's indirect
// call: at 15 bytes that call alone made the check slower than a plain 8-byte loop.
inline constexpr std::size_t kInlineCheckMax = 64;

namespace detail {
using FindFn = std::size_t (*)(const std::uint8_t* p, std::size_t n, std::uint8_t pattern);
// The implementation chosen for this CPU; a resolver that replaces itself until then.
extern std::atomic<FindFn> g_find;
// The first byte of [p, p+n) that differs from the pattern, or n. Called only after a compare
// saw a mismatch.
std::size_t first_mismatch_bytewise(const std::uint8_t* p, std::size_t n, std::uint8_t pattern);

template <typename Word>
BRISK_ALWAYS_INLINE Word load(const std::uint8_t* p) {
  Word v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Blocks of 1..15 bytes: two overlapping loads of the widest word that fits cover the block in
// one compare, with no loop and no byte-by-byte remainder. Returns whether the block is damaged.
BRISK_ALWAYS_INLINE bool damaged_below_16(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  if (n >= 8) {
    const std::uint64_t w = 0x0101010101010101ull * pattern;
    return ((load<std::uint64_t>(p) ^ w) | (load<std::uint64_t>(p + n - 8) ^ w)) != 0;
  }
  if (n >= 4) {
    const std::uint32_t w = 0x01010101u * pattern;
    return ((load<std::uint32_t>(p) ^ w) | (load<std::uint32_t>(p + n - 4) ^ w)) != 0;
  }
  if (n >= 2) {
    const auto w = static_cast<std::uint16_t>(0x0101u * pattern);
    return ((load<std::uint16_t>(p) ^ w) | (load<std::uint16_t>(p + n - 2) ^ w)) != 0;
  }
  return n == 1 && p[0] != pattern;
}

// Blocks of 0..kInlineCheckMax bytes. SSE2 is part of x86-64, so it needs no dispatch: 16..64
// bytes take two or four overlapping 16-byte compares.
BRISK_ALWAYS_INLINE std::size_t find_up_to_64(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  bool damaged;
  if (n < 16) {
    damaged = damaged_below_16(p, n, pattern);
  } else {
#if defined(__SSE2__)
    const __m128i v = _mm_set1_epi8(static_cast<char>(pattern));
    auto eq = [v](const std::uint8_t* at) { return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)), v); };
    __m128i all = _mm_and_si128(eq(p), eq(p + n - 16));
    if (n > 32) all = _mm_and_si128(all, _mm_and_si128(eq(p + 16), eq(p + n - 32)));
    damaged = _mm_movemask_epi8(all) != 0xFFFF;
#else
    const std::uint64_t w = 0x0101010101010101ull * pattern;
    std::uint64_t x = load<std::uint64_t>(p + n - 8) ^ w;
    for (std::size_t i = 0; i + 8 <= n; i += 8) x |= load<std::uint64_t>(p + i) ^ w;
    damaged = x != 0;
#endif
  }
  return BRISK_UNLIKELY(damaged) ? first_mismatch_bytewise(p, n, pattern) : n;
}
}  // namespace detail

inline std::size_t find_fill_damage(const void* block, std::size_t size, std::uint8_t pattern) {
  const auto* p = static_cast<const std::uint8_t*>(block);
  if (size <= kInlineCheckMax) return detail::find_up_to_64(p, size, pattern);
  return detail::g_find.load(std::memory_order_relaxed)(p, size, pattern);
}

namespace detail {
// check_fill once find_fill_damage found damage at `first`: collects the ranges.
bool damage_found(const void* block, std::size_t size, std::uint8_t pattern, std::size_t first, FillDamage* damage);

// Blocks of 0..kInlineCheckMax bytes: overlapping stores of the widest word that fits, as the
// check's loads. A debug block's 8-byte guard and canary and its small user data are filled
// at every allocation and free: a call to memset cost more than the stores.
BRISK_ALWAYS_INLINE void fill_up_to_64(std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  auto store = [](std::uint8_t* at, auto v) { std::memcpy(at, &v, sizeof v); };
  if (n >= 16) {
#if defined(__SSE2__)
    const __m128i v = _mm_set1_epi8(static_cast<char>(pattern));
    auto store16 = [v](std::uint8_t* at) { _mm_storeu_si128(reinterpret_cast<__m128i*>(at), v); };
#else
    const std::uint64_t w = 0x0101010101010101ull * pattern;
    auto store16 = [w, store](std::uint8_t* at) { store(at, w), store(at + 8, w); };
#endif
    store16(p);
    store16(p + n - 16);
    if (n > 32) store16(p + 16), store16(p + n - 32);
  } else if (n >= 8) {
    const std::uint64_t w = 0x0101010101010101ull * pattern;
    store(p, w), store(p + n - 8, w);
  } else if (n >= 4) {
    const std::uint32_t w = 0x01010101u * pattern;
    store(p, w), store(p + n - 4, w);
  } else if (n >= 2) {
    const auto w = static_cast<std::uint16_t>(0x0101u * pattern);
    store(p, w), store(p + n - 2, w);
  } else if (n == 1) {
    p[0] = pattern;
  }
}
}  // namespace detail

inline void fill_block(void* block, std::size_t size, std::uint8_t pattern) {
  if (size <= kInlineCheckMax) return detail::fill_up_to_64(static_cast<std::uint8_t*>(block), size, pattern);
  std::memset(block, pattern, size);
}

// Inline while the block is intact (the common case): a guard's or a small block's check is a
// few compares, no call.
inline bool check_fill(const void* block, std::size_t size, std::uint8_t pattern, FillDamage* damage) {
  const std::size_t first = find_fill_damage(block, size, pattern);
  if (BRISK_LIKELY(first == size)) return true;
  return detail::damage_found(block, size, pattern, first, damage);
}
void fill_check_init();

// The implementation find_fill_damage uses on this CPU (after fill_check_init or a first check).
FillCheckImpl fill_check_selected();
bool fill_check_supported(FillCheckImpl impl);
const char* fill_check_name(FillCheckImpl impl);
// Precondition: fill_check_supported(impl).
std::size_t find_fill_damage_with(FillCheckImpl impl, const void* block, std::size_t size, std::uint8_t pattern);
bool check_fill_with(FillCheckImpl impl, const void* block, std::size_t size, std::uint8_t pattern,
                     FillDamage* damage);

}  // namespace brisk::debug
