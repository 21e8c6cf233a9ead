// Fill, check and report for the block pattern described in pattern.h.
#include "stress/pattern.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "stress/rng.h"

namespace brisk::stress {
namespace {

constexpr std::uint64_t kWordStep = 0x9E3779B97F4A7C15ull;

std::size_t stride_for(std::size_t size) {
  std::size_t stride = kMinStride;
  while (size / stride > kMaxInteriorWords) stride *= 2;
  return stride;
}

inline std::uint64_t word_at(std::uint64_t hash, std::size_t word_index) {
  return hash + word_index * kWordStep;
}

inline unsigned char byte_at(std::uint64_t hash, std::size_t off) {
  return static_cast<unsigned char>(word_at(hash, off / 8) >> (8 * (off % 8)));
}

// Calls fn(lo, hi) for each maximal range of S(size) ∩ [from, to), in increasing order. The
// ranges may overlap at the edges for small blocks; callers only read or write the same values.
template <typename Fn>
void for_each_sampled(std::size_t size, std::size_t from, std::size_t to, Fn fn) {
  to = std::min(to, size);
  if (from >= to) return;
  auto clip = [&](std::size_t lo, std::size_t hi) {
    lo = std::max(lo, from);
    hi = std::min(hi, to);
    if (lo < hi) fn(lo, hi);
  };
  if (size <= 2 * kEdgeBytes) {
    clip(0, size);
    return;
  }
  clip(0, kEdgeBytes);
  const std::size_t tail = size - kEdgeBytes;
  const std::size_t stride = stride_for(size);
  for (std::size_t at = stride; at < tail; at += stride) clip(at, std::min(at + 8, tail));
  clip(tail, size);
}

void fill_range(unsigned char* p, std::uint64_t hash, std::size_t lo, std::size_t hi) {
  while (lo < hi && lo % 8 != 0) {
    p[lo] = byte_at(hash, lo);
    ++lo;
  }
  for (; lo + 8 <= hi; lo += 8) {
    const std::uint64_t w = word_at(hash, lo / 8);
    std::memcpy(p + lo, &w, 8);  // little-endian: byte k of w lands at lo + k, as byte_at says
  }
  for (; lo < hi; ++lo) p[lo] = byte_at(hash, lo);
}

// Returns the first offset in [lo, hi) whose byte differs from the pattern, or hi.
std::size_t check_range(const unsigned char* p, std::uint64_t hash, std::size_t lo,
                        std::size_t hi) {
  while (lo < hi && lo % 8 != 0) {
    if (p[lo] != byte_at(hash, lo)) return lo;
    ++lo;
  }
  for (; lo + 8 <= hi; lo += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + lo, 8);
    if (w != word_at(hash, lo / 8)) break;
  }
  for (; lo < hi; ++lo)
    if (p[lo] != byte_at(hash, lo)) return lo;
  return hi;
}

void report(const char* workload, const BlockId& id, std::size_t offset, const char* detail) {
  // One line, written with a single fprintf so other threads' output does not split it.
  std::fprintf(stderr,
               "VERIFY FAILED: workload=%s block=task%" PRIu32 "/iter%" PRIu64
               "/slot%" PRIu32 " offset=%zu %s\n",
               workload, id.task, id.iteration, id.slot, offset, detail);
  std::fflush(stderr);
  std::fflush(stdout);
  // _exit: other threads are still running and may hold the damaged heap; running static
  // destructors or atexit handlers now could crash and hide the report's exit status.
  _exit(1);
}

}  // namespace

std::uint64_t workload_base(std::uint64_t seed, const char* workload) {
  std::uint64_t h = mix64(seed ^ 0x6A09E667F3BCC909ull);
  for (const char* c = workload; *c; ++c) h = mix64(h ^ static_cast<unsigned char>(*c));
  return h;
}

std::uint64_t pattern_hash(std::uint64_t base, const BlockId& id) {
  return mix64(base + id.task * 0xD1B54A32D192ED03ull + id.iteration * 0x8CB92BA72F3D8DD7ull +
               id.slot * 0xABC98388FB8FAC03ull);
}

void fill_pattern(const Block& block, std::size_t from) {
  auto* p = static_cast<unsigned char*>(block.ptr);
  for_each_sampled(block.size, from, block.size,
                   [&](std::size_t lo, std::size_t hi) { fill_range(p, block.hash, lo, hi); });
}

void verify_pattern(const char* workload, const Block& block, const char* when,
                    std::size_t limit) {
  const auto* p = static_cast<const unsigned char*>(block.ptr);
  for_each_sampled(block.size, 0, limit, [&](std::size_t lo, std::size_t hi) {
    const std::size_t bad = check_range(p, block.hash, lo, hi);
    if (bad != hi) {
      char detail[160];
      std::snprintf(detail, sizeof detail, "size=%zu expected=0x%02x found=0x%02x (%s)",
                    block.size, byte_at(block.hash, bad), p[bad], when);
      report(workload, block.id, bad, detail);
    }
  });
}

void verify_zero(const char* workload, const Block& block, const char* when) {
  const auto* p = static_cast<const unsigned char*>(block.ptr);
  for_each_sampled(block.size, 0, block.size, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      if (p[i] != 0) {
        char detail[160];
        std::snprintf(detail, sizeof detail, "size=%zu expected=0x00 found=0x%02x (%s)",
                      block.size, p[i], when);
        report(workload, block.id, i, detail);
      }
    }
  });
}

void fail_verify(const char* workload, const BlockId& id, std::size_t offset,
                 const char* detail) {
  report(workload, id, offset, detail);
  std::abort();  // not reached: report exits
}

Block new_block(const char* workload, std::uint64_t base, const BlockId& id, std::size_t size) {
  Block b;
  b.size = size;
  b.id = id;
  b.hash = pattern_hash(base, id);
  b.ptr = std::malloc(size);
  if (b.ptr == nullptr) fail_verify(workload, id, 0, "malloc returned NULL");
  fill_pattern(b);
  return b;
}

void free_block(const char* workload, const Block& block, const char* when) {
  verify_pattern(workload, block, when);
  std::free(block.ptr);
}

Block verified_realloc(const char* workload, Block block, std::size_t new_size) {
  verify_pattern(workload, block, "before realloc");
  void* moved = std::realloc(block.ptr, new_size);
  if (moved == nullptr) fail_verify(workload, block.id, 0, "realloc returned NULL");
  const std::size_t old_size = block.size;
  block.ptr = moved;
  if (new_size >= old_size) {
    // S(new) ∩ [0, old) ⊂ S(old) (pattern.h), so the checked prefix is exactly what survives.
    Block old_view = block;
    old_view.size = old_size;
    verify_pattern(workload, old_view, "after realloc");
    block.size = new_size;
    fill_pattern(block, old_size);
  } else {
    Block old_view = block;
    old_view.size = old_size;
    verify_pattern(workload, old_view, "after realloc", new_size);
    block.size = new_size;
    fill_pattern(block);  // a shrunk block's tail edge is new ground
  }
  return block;
}

}  // namespace brisk::stress
