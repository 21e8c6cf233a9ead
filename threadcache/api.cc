// The brisk_* C API, and the out-of-line parts of the entry points: medium and large blocks,
// realloc, aligned allocation, usable size. Every failure sets errno as the README's
// "Bad input" table says.
#include <brisk/brisk.h>

#include <errno.h>
#include <stdint.h>

#include <cstring>

#include "core/central_pool.h"
#include "core/large.h"
#include "core/report.h"
#include "core/stats.h"
#include "threadcache/alloc_inline.h"

namespace brisk {
namespace {

// Validates p (aborting with a report if brisk did not hand it out) and returns what the
// caller may use. span_out/large_out say where it lives.
std::size_t checked_usable(const void* p, Span** span_out, LargeHeader** large_out) {
  BlockRef ref = checked_block(p, "invalid pointer");
  *span_out = ref.span;
  *large_out = ref.large;
  if (ref.large != nullptr) return large_usable_size(p, ref.large);
  if (static_cast<const Block*>(p)->key == free_key(p))
    fatal_pointer_error("use of freed block", p, nullptr);
  return ref.span->block_size;
}

void* move_block(void* p, std::size_t old_usable, std::size_t size) {
  void* q = malloc_inline(size);
  if (q == nullptr) return nullptr;  // errno is set; p is intact
  std::memcpy(q, p, old_usable < size ? old_usable : size);
  free_inline(p);
  return q;
}

}  // namespace

void* alloc_big(std::size_t size, std::size_t alignment, bool zero) {
  if (BRISK_UNLIKELY(size > static_cast<std::size_t>(PTRDIFF_MAX))) {
    errno = ENOMEM;
    return nullptr;
  }
  void* p;
  if (size <= kMediumMax && alignment <= kPageSize) {
    Heap* h = t_heap;
    if (h == &g_sentinel_heap) h = heap_for_this_thread();
    p = h != nullptr ? alloc_medium(h, size, zero) : nullptr;
  } else {
    p = large_alloc(size, alignment, zero);
  }
  if (p == nullptr) errno = ENOMEM;
  return p;
}

void* calloc_big(std::size_t count, std::size_t size) {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return alloc_big(total, kMinAlign, true);
}

void* realloc_impl(void* p, std::size_t size) {
  if (p == nullptr) return malloc_inline(size);
  // Fast path: a small block of this thread's, to a small size (MMtest's small test is this).
  Heap* h = t_heap;
  if (Span* s = own_span_of(h, p); s != nullptr && s->kind == SpanKind::kSmall && size - 1 < kSmallMax) {
    std::size_t usable = s->block_size;
    if (size <= usable && size > usable / 2) return p;
    void* q = alloc_small(h, size_to_class(size));
    if (q == nullptr) return nullptr;  // errno is set; p is intact
    std::memcpy(q, p, usable < size ? usable : size);
    free_to_own_span(h, s, static_cast<Block*>(p), free_code(reinterpret_cast<std::uintptr_t>(p)));
    return q;
  }
  if (size > static_cast<std::size_t>(PTRDIFF_MAX)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (size == 0) {  // glibc's behaviour: free and return NULL
    free_inline(p);
    return nullptr;
  }
  Span* s;
  LargeHeader* lh;
  std::size_t usable = checked_usable(p, &s, &lh);
  if (s != nullptr && s->kind == SpanKind::kSmall) {
    // Stay in place when the block fits and would not waste more than half of it.
    if (size <= usable && size > usable / 2) return p;
    return move_block(p, usable, size);
  }
  if (s != nullptr) {  // medium: grow into or shrink from the neighbouring pages
    if (size > kSmallMax && size <= kMediumMax && medium_resize_in_place(s, size))
      return p;
    if (size <= usable && size > kSmallMax) return p;
    return move_block(p, usable, size);
  }
  if (size > kMediumMax) {
    void* q = large_realloc(p, lh, size);
    if (q != nullptr) return q;
  }
  return move_block(p, usable, size);
}

void* aligned_alloc_impl(std::size_t alignment, std::size_t size) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (alignment <= kMinAlign) return malloc_inline(size);
  if (alignment <= kPageSize) {
    std::size_t s = size < alignment ? alignment : size;
    if (s <= kSmallMax) {
      // Blocks start at page-aligned span starts plus multiples of the class size, so a class
      // whose size is a multiple of the alignment serves it. One exists by 64 KiB at the latest.
      unsigned c = size_to_class(s);
      while (kClasses[c].size % alignment != 0) ++c;
      return alloc_small(t_heap, c);
    }
  }
  return alloc_big(size, alignment, false);
}

std::size_t usable_size_impl(const void* p) {
  if (p == nullptr) return 0;
  Span* s;
  LargeHeader* lh;
  return checked_usable(p, &s, &lh);
}

}  // namespace brisk

using namespace brisk;

extern "C" {

BRISK_EXPORT void* brisk_malloc(size_t size) { return malloc_inline(size); }
BRISK_EXPORT void* brisk_calloc(size_t count, size_t size) { return calloc_inline(count, size); }
BRISK_EXPORT void* brisk_realloc(void* p, size_t size) { return realloc_impl(p, size); }
BRISK_EXPORT void brisk_free(void* p) { free_inline(p); }
BRISK_EXPORT void brisk_free_sized(void* p, size_t) { free_inline(p); }
BRISK_EXPORT void* brisk_aligned_alloc(size_t alignment, size_t size) {
  return aligned_alloc_impl(alignment, size);
}
BRISK_EXPORT size_t brisk_usable_size(const void* p) { return usable_size_impl(p); }

BRISK_EXPORT void brisk_thread_collect(void) {
  Heap* h = t_heap;
  if (h != &g_sentinel_heap) {
    heap_collect(h);
  } else {
    drain_orphans();
    large_cache_flush();
  }
}

BRISK_EXPORT void brisk_get_stats(brisk_stats* out) {
  if (out == nullptr) return;
  auto& g = stats::g;
  auto rd = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  out->chunks_mapped = rd(g.chunks_mapped);
  out->chunk_bytes_mapped = rd(g.chunks_mapped) * kChunkSize;
  out->large_bytes_mapped = rd(g.large_bytes_mapped);
  out->large_bytes_cached = rd(g.large_bytes_cached);
  out->large_live_blocks = rd(g.large_live_blocks);
  out->os_map_calls = rd(g.os_map_calls);
  out->os_unmap_calls = rd(g.os_unmap_calls);
  out->os_decommit_calls = rd(g.os_decommit_calls);
  out->heaps_live = rd(g.heaps_live);
  out->heaps_total = rd(g.heaps_total);
  out->spans_orphaned = rd(g.spans_orphaned);
  out->chunk_bytes_cached = rd(g.chunks_cached) * kChunkSize;
}

}  // extern "C"
