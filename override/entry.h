// The entry layer's inline entry points, shared by the brisk_* API (brisk_api.cc) and the
// malloc and operator new replacements (malloc.cc, new.cc), so that each gets the thread
// cache's fast paths inlined with no call in between. Their out-of-line parts are in entry.cc.
#pragma once

#include <errno.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/config.h"
#include "core/hints.h"
#include "core/size_class.h"
#include "threadcache/heap.h"

namespace brisk {

// Medium and large blocks, errno for impossible sizes. alignment: a power of two.
void* alloc_big(std::size_t size, std::size_t alignment, bool zero);
void* realloc_impl(void* p, std::size_t size);
void* aligned_alloc_impl(std::size_t alignment, std::size_t size);
std::size_t usable_size_impl(const void* p);
// A free that names what it expects (debug::Kind as an int: 0 malloc, 1 new, 2 new[]) and the
// size the caller gave (0: none), which a debug block checks; free_inline otherwise.
void free_checked_impl(void* p, int kind, std::size_t size);
void* calloc_big(std::size_t count, std::size_t size);

BRISK_ALWAYS_INLINE void* malloc_inline(std::size_t size) {
  if (BRISK_LIKELY(size <= kSmallMax)) return alloc_small(t_heap, size_to_class(size), size);
  return alloc_big(size, kMinAlign, false);
}

BRISK_ALWAYS_INLINE void free_inline(void* p) { free_fast(p); }

BRISK_ALWAYS_INLINE void* calloc_inline(std::size_t count, std::size_t size) {
  std::size_t total;
  if (BRISK_UNLIKELY(__builtin_mul_overflow(count, size, &total) || total > kSmallMax))
    return calloc_big(count, size);
  void* p = alloc_small(t_heap, size_to_class(total), total);
  if (BRISK_LIKELY(p != nullptr)) std::memset(p, 0, total);
  return p;
}

}  // namespace brisk
