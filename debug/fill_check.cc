#include "debug/fill_check.h"

#include <atomic>
#include <cstring>

#include "core/assert.h"
#include "core/hints.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define BRISK_FILL_CHECK_X86 1
#else
#define BRISK_FILL_CHECK_X86 0
#endif

namespace brisk::debug {
namespace {

using detail::FindFn;
using detail::first_mismatch_bytewise;
using detail::load;

BRISK_ALWAYS_INLINE std::uint64_t load64(const std::uint8_t* p) { return load<std::uint64_t>(p); }

BRISK_ALWAYS_INLINE std::size_t find_below_16(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  return BRISK_UNLIKELY(detail::damaged_below_16(p, n, pattern)) ? first_mismatch_bytewise(p, n, pattern) : n;
}

// Portable: 32 bytes per iteration as four 8-byte words, then 8-byte words, then one
// overlapping word for the tail. Bytes before the overlap are already known intact, so the
// first mismatch inside an overlapping load is the block's first.
std::size_t find_portable(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  if (n < 16) return find_below_16(p, n, pattern);
  const std::uint64_t w = 0x0101010101010101ull * pattern;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const std::uint64_t x = (load64(p + i) ^ w) | (load64(p + i + 8) ^ w) | (load64(p + i + 16) ^ w) |
                            (load64(p + i + 24) ^ w);
    if (BRISK_UNLIKELY(x != 0)) return i + first_mismatch_bytewise(p + i, 32, pattern);
  }
  for (; i + 8 <= n; i += 8)
    if (BRISK_UNLIKELY(load64(p + i) != w)) return i + first_mismatch_bytewise(p + i, 8, pattern);
  if (i < n && BRISK_UNLIKELY(load64(p + n - 8) != w)) return n - 8 + first_mismatch_bytewise(p + n - 8, 8, pattern);
  return n;
}

#if BRISK_FILL_CHECK_X86

// The helpers carry their function's target: a lambda or plain inline function would not.
#define BRISK_SSE2 __attribute__((target("sse2"), always_inline)) inline
#define BRISK_AVX2 __attribute__((target("avx2"), always_inline)) inline
#define BRISK_AVX512 __attribute__((target("avx512f,avx512bw"), always_inline)) inline

BRISK_SSE2 __m128i eq16(const std::uint8_t* p, __m128i v) {
  return _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), v);
}
// Index of the first byte of the 16 at p that differs from v, or 16.
BRISK_SSE2 std::size_t first_in_16(const std::uint8_t* p, __m128i v) {
  const unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(eq16(p, v)));
  return mask == 0xFFFFu ? 16 : static_cast<std::size_t>(__builtin_ctz(~mask));
}

// SSE2: four 16-byte compares per iteration folded into one movemask, then 16-byte steps and
// an overlapping last vector.
__attribute__((target("sse2"))) std::size_t find_sse2(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  if (n < 16) return find_below_16(p, n, pattern);
  const __m128i v = _mm_set1_epi8(static_cast<char>(pattern));
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i all = _mm_and_si128(_mm_and_si128(eq16(p + i, v), eq16(p + i + 16, v)),
                                      _mm_and_si128(eq16(p + i + 32, v), eq16(p + i + 48, v)));
    if (BRISK_UNLIKELY(_mm_movemask_epi8(all) != 0xFFFF)) return i + first_mismatch_bytewise(p + i, 64, pattern);
  }
  for (; i + 16 <= n; i += 16) {
    const std::size_t f = first_in_16(p + i, v);
    if (BRISK_UNLIKELY(f != 16)) return i + f;
  }
  if (i < n) {
    const std::size_t f = first_in_16(p + n - 16, v);
    if (BRISK_UNLIKELY(f != 16)) return n - 16 + f;
  }
  return n;
}

BRISK_AVX2 __m256i eq32(const std::uint8_t* p, __m256i v) {
  return _mm256_cmpeq_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), v);
}
BRISK_AVX2 std::size_t first_in_32(const std::uint8_t* p, __m256i v) {
  const unsigned mask = static_cast<unsigned>(_mm256_movemask_epi8(eq32(p, v)));
  return mask == 0xFFFFFFFFu ? 32 : static_cast<std::size_t>(__builtin_ctz(~mask));
}

// AVX2: as SSE2 with 32-byte vectors, 128 bytes per iteration. 16..31 bytes take two
// overlapping 16-byte compares.
__attribute__((target("avx2"))) std::size_t find_avx2(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  if (n < 32) {
    if (n < 16) return find_below_16(p, n, pattern);
    const __m128i v = _mm_set1_epi8(static_cast<char>(pattern));
    const __m128i both = _mm_and_si128(eq16(p, v), eq16(p + n - 16, v));
    if (BRISK_UNLIKELY(_mm_movemask_epi8(both) != 0xFFFF)) return first_mismatch_bytewise(p, n, pattern);
    return n;
  }
  const __m256i v = _mm256_set1_epi8(static_cast<char>(pattern));
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i all = _mm256_and_si256(_mm256_and_si256(eq32(p + i, v), eq32(p + i + 32, v)),
                                         _mm256_and_si256(eq32(p + i + 64, v), eq32(p + i + 96, v)));
    if (BRISK_UNLIKELY(static_cast<unsigned>(_mm256_movemask_epi8(all)) != 0xFFFFFFFFu))
      return i + first_mismatch_bytewise(p + i, 128, pattern);
  }
  for (; i + 32 <= n; i += 32) {
    const std::size_t f = first_in_32(p + i, v);
    if (BRISK_UNLIKELY(f != 32)) return i + f;
  }
  if (i < n) {
    const std::size_t f = first_in_32(p + n - 32, v);
    if (BRISK_UNLIKELY(f != 32)) return n - 32 + f;
  }
  return n;
}

BRISK_AVX512 __mmask64 ne64(const std::uint8_t* p, __m512i v) { return _mm512_cmpneq_epi8_mask(_mm512_loadu_si512(p), v); }

// The first damaged byte of the last n - at (<= 64) bytes, or n. Masked-off bytes of a masked
// load neither fault nor count, so nothing past the block's end is read.
BRISK_AVX512 std::size_t find_tail_64(const std::uint8_t* p, std::size_t at, std::size_t n, __m512i v) {
  const std::size_t left = n - at;
  const __mmask64 k = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
  const __mmask64 bad = _mm512_mask_cmpneq_epi8_mask(k, _mm512_maskz_loadu_epi8(k, p + at), v);
  return bad == 0 ? n : at + static_cast<std::size_t>(__builtin_ctzll(bad));
}

// AVX-512 (BW for byte compares): compares yield bit masks directly, and one masked load
// covers a block of up to 64 bytes, or the tail.
__attribute__((target("avx512f,avx512bw"))) std::size_t find_avx512(const std::uint8_t* p, std::size_t n,
                                                                     std::uint8_t pattern) {
  const __m512i v = _mm512_set1_epi8(static_cast<char>(pattern));
  if (n <= 64) return find_tail_64(p, 0, n, v);
  std::size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    const __mmask64 bad = ne64(p + i, v) | ne64(p + i + 64, v) | ne64(p + i + 128, v) | ne64(p + i + 192, v);
    if (BRISK_UNLIKELY(bad != 0)) return i + first_mismatch_bytewise(p + i, 256, pattern);
  }
  for (; i + 64 <= n; i += 64) {
    const __mmask64 bad = ne64(p + i, v);
    if (BRISK_UNLIKELY(bad != 0)) return i + static_cast<std::size_t>(__builtin_ctzll(bad));
  }
  return i < n ? find_tail_64(p, i, n, v) : n;
}

#endif  // BRISK_FILL_CHECK_X86

bool supported(FillCheckImpl impl) {
#if BRISK_FILL_CHECK_X86
  __builtin_cpu_init();
  switch (impl) {
    case FillCheckImpl::kPortable: return true;
    case FillCheckImpl::kSse2: return __builtin_cpu_supports("sse2");
    case FillCheckImpl::kAvx2: return __builtin_cpu_supports("avx2");
    case FillCheckImpl::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    default: return false;
  }
#else
  return impl == FillCheckImpl::kPortable;
#endif
}

FindFn function_of(FillCheckImpl impl) {
  switch (impl) {
#if BRISK_FILL_CHECK_X86
    case FillCheckImpl::kSse2: return find_sse2;
    case FillCheckImpl::kAvx2: return find_avx2;
    case FillCheckImpl::kAvx512: return find_avx512;
#endif
    default: return find_portable;
  }
}

// The preference order, widest first; see bench/README.md for the measurements behind it.
FillCheckImpl best_supported() {
  for (FillCheckImpl impl : {FillCheckImpl::kAvx512, FillCheckImpl::kAvx2, FillCheckImpl::kSse2})
    if (supported(impl)) return impl;
  return FillCheckImpl::kPortable;
}

std::size_t resolve_and_find(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  fill_check_init();
  return detail::g_find.load(std::memory_order_relaxed)(p, n, pattern);
}

std::atomic<FillCheckImpl> g_selected{FillCheckImpl::kPortable};

// The dispatched check as a FindFn, for collect_ranges.
std::size_t find_dispatched(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  return find_fill_damage(p, n, pattern);
}

// Walks the damage from `first`: each range runs to the next intact byte, and the next range
// is found with the wide compare again, so a long intact stretch between ranges stays cheap.
void collect_ranges(FindFn find, const std::uint8_t* p, std::size_t n, std::uint8_t pattern, std::size_t first,
                    FillDamage* damage) {
  damage->first_offset = first;
  damage->range_count = 0;
  damage->more_ranges = false;
  std::size_t at = first;
  while (at < n) {
    if (damage->range_count == kMaxDamagedRanges) {
      damage->more_ranges = true;
      return;
    }
    std::size_t end = at + 1;
    while (end < n && p[end] != pattern) ++end;
    damage->ranges[damage->range_count++] = {at, end - at};
    at = end == n ? n : end + find(p + end, n - end, pattern);
  }
}

bool check_with(FindFn find, const void* block, std::size_t size, std::uint8_t pattern, FillDamage* damage) {
  const auto* p = static_cast<const std::uint8_t*>(block);
  const std::size_t first = find(p, size, pattern);
  if (BRISK_LIKELY(first == size)) return true;
  collect_ranges(find, p, size, pattern, first, damage);
  return false;
}

}  // namespace

namespace detail {
// Starts at the resolver, which replaces itself with the chosen function. Every thread that
// races through the resolver stores the same value, so relaxed order suffices.
std::atomic<FindFn> g_find{resolve_and_find};

BRISK_NOINLINE std::size_t first_mismatch_bytewise(const std::uint8_t* p, std::size_t n, std::uint8_t pattern) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern) return i;
  return n;
}
}  // namespace detail

void fill_check_init() {
  const FillCheckImpl impl = best_supported();
  g_selected.store(impl, std::memory_order_relaxed);
  detail::g_find.store(function_of(impl), std::memory_order_relaxed);
}

bool detail::damage_found(const void* block, std::size_t size, std::uint8_t pattern, std::size_t first,
                          FillDamage* damage) {
  collect_ranges(find_dispatched, static_cast<const std::uint8_t*>(block), size, pattern, first, damage);
  return false;
}

FillCheckImpl fill_check_selected() {
  if (detail::g_find.load(std::memory_order_relaxed) == resolve_and_find) fill_check_init();
  return g_selected.load(std::memory_order_relaxed);
}

bool fill_check_supported(FillCheckImpl impl) { return supported(impl); }

const char* fill_check_name(FillCheckImpl impl) {
  switch (impl) {
    case FillCheckImpl::kPortable: return "portable";
    case FillCheckImpl::kSse2: return "sse2";
    case FillCheckImpl::kAvx2: return "avx2";
    case FillCheckImpl::kAvx512: return "avx512";
    default: return "?";
  }
}

std::size_t find_fill_damage_with(FillCheckImpl impl, const void* block, std::size_t size, std::uint8_t pattern) {
  BRISK_ASSERT(supported(impl));
  return function_of(impl)(static_cast<const std::uint8_t*>(block), size, pattern);
}

bool check_fill_with(FillCheckImpl impl, const void* block, std::size_t size, std::uint8_t pattern,
                     FillDamage* damage) {
  BRISK_ASSERT(supported(impl));
  return check_with(function_of(impl), block, size, pattern, damage);
}

}  // namespace brisk::debug
