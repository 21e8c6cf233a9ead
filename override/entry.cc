// The out-of-line parts of the entry points, where the C library's rules live: errno for
// impossible sizes, calloc's overflow, realloc's (pointer checked first, 0 frees, in place when
// it fits), aligned allocation, usable size. Every failure sets errno as the README's
// "Bad input" table says. Shared by malloc.cc, new.cc and brisk_api.cc.
#include "override/entry.h"

#include <errno.h>
#include <stdint.h>

#include <atomic>
#include <cstring>

#include "core/central_pool.h"
#include "core/large.h"
#include "core/options.h"
#include "core/report.h"
#include "core/stats.h"
#include "debug/block.h"
#include "threadcache/debug_switch.h"
#include "threadcache/medium.h"

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

// The largest medium block, a strategy lever (BRISK_MEDIUM_MAX) within the compile-time bound;
// read on every allocation above kSmallMax, as cheap as the lever reads of the slow paths.
std::size_t medium_max() {
  return static_cast<std::size_t>(options::get(options::Id::kMediumMax));
}

// The new block of a realloc that grows from old_usable to size and must move. When it grows by
// less than half, its new medium block takes pages for half its size again (within medium_max()),
// past the block and untouched: a buffer grown in small steps tends to grow again, and its next
// steps then stay in place (medium_resize_in_place) instead of copying the whole block each time
// (brisk-stress realloc, buffers grown 8 B to 1 MiB by 1/16 to 1/2: 2.8 GB copied at --scale 30,
// 1.8 GB with the room; jemalloc copied 2.6 GB, tcmalloc 5.8). A bigger step would not fit the
// room again, so it gets none: MMtest medium, which doubles each block once, then frees it, took
// 20% more peak memory with the room. Only page claims: a spare page costs memory once written
// (or if it was resident already, as a free page), and a free gives them back with the block.
//
// A block that grows past kGrowLargeMin this way becomes a large block even below medium_max():
// a large block grows into the cached space after its mapping (large_realloc), so a buffer
// still growing is neither copied again nor bound to the free pages of one chunk.
// brisk-stress realloc (buffers grown 8 B to 1 MiB, 1/16 to 1/2 a step): 0.726 [0.640, 0.897]
// of the time at full scale, 0.694 [0.685, 0.737] at --scale 10 with 91 MiB against 115;
// brisk-grow-loop with 2,000 buffers growing to 800 KiB: 0.779 [0.758, 0.804]; prodcons, whose
// blocks are not grown, level (0.978 [0.939, 1.083]). Blocks that malloc makes at those sizes
// stay medium: the large path's one lock and its 4 MiB-aligned carving cost more for them
// (prodcons took 1.08x the time with BRISK_MEDIUM_MAX=256k).
//
// In debug mode the new block is a debug block placed the same way (debug::Growth), so that its
// next steps too stay in place (debug::realloc_in_place) rather than copy, fill and check it.
void* grow_elsewhere(std::size_t old_usable, std::size_t size) {
  const std::size_t max = medium_max();  // one read: a strategy switch may change it meanwhile
  const bool debug = BRISK_UNLIKELY(debug_mode_on());
  if (size > kGrowLargeMin && size <= max) {
    if (debug) return debug::allocate(size, kMinAlign, debug::Kind::kMalloc, false, {0, true});
    void* q = large_alloc_here(size, kMinAlign, false, true);
    if (q == nullptr) errno = ENOMEM;
    return q;
  }
  if (size <= kSmallMax || size > max || size >= old_usable + old_usable / 2) return malloc_inline(size);
  const std::size_t room = size + size / 2 < max ? size + size / 2 : max;
  if (debug) return debug::allocate(size, kMinAlign, debug::Kind::kMalloc, false, {room, false});
  void* q = alloc_medium_here(size, false, room);
  if (q == nullptr) errno = ENOMEM;
  return q;
}

// A debug block for an aligned allocation: its kind is the caller's (operator new's), or
// "aligned" for the C calls.
void* aligned_debug_block(std::size_t size, std::size_t alignment) {
  const debug::Kind kind = debug::t_alloc_kind == debug::Kind::kMalloc ? debug::Kind::kAligned : debug::t_alloc_kind;
  return debug::allocate(size, alignment, kind, false);
}

void* move_block(void* p, std::size_t old_usable, std::size_t size) {
  void* q = size > old_usable ? grow_elsewhere(old_usable, size) : malloc_inline(size);
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
  if (BRISK_UNLIKELY(debug_mode_on()) && alignment <= debug::kMaxAlignment)
    return debug::allocate(size, alignment, debug::t_alloc_kind, zero);
  void* p = size <= medium_max() && alignment <= kPageSize ? alloc_medium_here(size, zero)
                                                           : large_alloc_here(size, alignment, zero);
  if (p == nullptr) errno = ENOMEM;
  return p;
}

// calloc of a medium or large block writes a zero byte at its start and at its end. Their pages
// are zeros already (the block's zeroing, or pages never touched since they were mapped or
// decommitted), but an untouched page that the program reads before writing (a check that the
// block is zeros, a struct read before it is filled) is mapped to the kernel's shared zero page,
// and the program's first write to it then faults again to copy it, with a TLB shootdown to every
// other CPU running the process (an interrupt each, through the hypervisor on a VM). Written here,
// the two pages come in as the program's own at once, one fault each, which its first write would
// have taken anyway. A program touches the start of nearly every block it callocs and the end of
// most (arrays it fills), so the cost is at most two pages of a block it never touches there
// (huge pages, where transparent_hugepage is "always"); the pages between are left as they are
// (a block written sparsely keeps only the pages it writes). brisk-stress prodcons (one block in
// four a calloc, checked to be zeros, then written at its edges and every 64 KiB) took 0.895
// [0.831, 0.972] of the time with it (9 pairs, Intel VM), its peak level; tcmalloc, whose calloc
// writes every byte, maps no zero page but every page.
void* calloc_big(std::size_t count, std::size_t size) {
  std::size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* p = static_cast<unsigned char*>(alloc_big(total, kMinAlign, true));
  if (p != nullptr) {
    // Atomic (relaxed) stores: plain stores of the zero already there could be dropped.
    std::atomic_ref<unsigned char>(p[0]).store(0, std::memory_order_relaxed);
    std::atomic_ref<unsigned char>(p[total - 1]).store(0, std::memory_order_relaxed);
  }
  return p;
}

void* realloc_impl(void* p, std::size_t size) {
  if (p == nullptr) return malloc_inline(size);
  // Fast path: a small block of this thread's, to a small size (MMtest's small test is this).
  Heap* h = t_heap;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (Span* own = own_carved_span(h, a); own != nullptr && own->kind == SpanKind::kSmall && size - 1 < kSmallMax) {
    FreeCode code = free_code(a);
    if (static_cast<Block*>(p)->key != code.key) {  // a freed block goes on to be reported below
      std::size_t usable = own->block_size;
      if (stays_in_small_block(size, usable)) return p;
      void* q = alloc_small(h, size_to_class(size), size);
      if (q == nullptr) return nullptr;  // errno is set; p is intact
      std::memcpy(q, p, usable < size ? usable : size);
      // alloc_small's refill drains h's queue, which may have given `own` to the central pool
      // (remote_free.cc's span keep): p is then freed as another thread's block.
      if (BRISK_LIKELY(own->owner.load(std::memory_order_relaxed) == h))
        free_to_own_span(h, own, static_cast<Block*>(p), code);
      else
        free_slow(p);
      return q;
    }
  }
  if (BRISK_UNLIKELY(g_debug_blocks_may_exist.load(std::memory_order_acquire))) {
    std::size_t old_size;
    switch (debug::check_before_realloc(p, &old_size)) {
      case debug::ReallocCheck::kNotDebug:
        break;
      case debug::ReallocCheck::kBad:
        errno = EINVAL;
        return nullptr;
      case debug::ReallocCheck::kLive: {
        // p is freed already (block.h): realloc_done finishes its free, or makes it live again.
        // In debug mode it stays where it is if it can; a debug block reallocated after the
        // mode was left becomes a release block.
        if (debug_mode_on() && debug::realloc_in_place(p, size)) {
          debug::realloc_done(p, false);
          return p;
        }
        const std::size_t copied = old_size < size ? old_size : size;
        void* q = nullptr;
        if (size != 0) {
          // A debug block made here gets the new pattern past the copy only: the copy
          // overwrites the rest at once.
          debug::CopiedPrefixScope scope(copied);
          q = size > old_size ? grow_elsewhere(old_size, size) : malloc_inline(size);  // made in the current mode
        }
        if (q != nullptr) std::memcpy(q, p, copied);
        debug::realloc_done(p, q != nullptr || size == 0);
        return q;
      }
    }
  }
  // p is validated before the size is looked at, so a foreign or freed pointer is reported
  // the same way whatever size comes with it.
  Span* s;
  LargeHeader* lh;
  std::size_t usable = checked_usable(p, &s, &lh);
  if (size > static_cast<std::size_t>(PTRDIFF_MAX)) {
    errno = ENOMEM;
    return nullptr;
  }
  if (size == 0) {  // glibc's behaviour: free and return NULL
    free_inline(p);
    return nullptr;
  }
  if (s != nullptr && s->kind == SpanKind::kSmall) {
    // Stay in place when the block fits and would not waste more than half of it.
    if (stays_in_small_block(size, usable)) return p;
    return move_block(p, usable, size);
  }
  if (s != nullptr) {  // medium: grow into or shrink from the neighbouring pages
    if (size > kSmallMax && size <= medium_max() && medium_resize_in_place(s, size))
      return p;
    if (size <= usable && size > kSmallMax) return p;
    return move_block(p, usable, size);
  }
  // A large block stays large above medium_max(), and above kGrowLargeMin (grow_elsewhere may
  // have made it large below medium_max()); smaller, it moves to a span.
  if (size > medium_max() || size > kGrowLargeMin) {
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
  if (BRISK_UNLIKELY(debug_mode_on()) && alignment <= debug::kMaxAlignment) return aligned_debug_block(size, alignment);
  if (alignment <= kPageSize) {
    std::size_t s = size < alignment ? alignment : size;
    if (s <= kSmallMax) {
      // Blocks start at page-aligned span starts plus multiples of the class size, so a class
      // whose size is a multiple of the alignment serves it. One exists by 64 KiB at the latest.
      unsigned c = size_to_class(s);
      while (kClasses[c].size % alignment != 0) ++c;
      void* p = alloc_small(t_heap, c, size);
      // Debug mode switched on since the check above: the refill handed the request to the
      // debug layer, whose hook knows no alignment (a 16-byte aligned debug block of the
      // thread's allocation kind). That block goes back, and one is made with the alignment.
      if (BRISK_UNLIKELY((reinterpret_cast<std::uintptr_t>(p) & (alignment - 1)) != 0)) {
        free_checked_impl(p, static_cast<int>(debug::t_alloc_kind), debug::kUnsized);
        return aligned_debug_block(size, alignment);
      }
      return p;
    }
  }
  return alloc_big(size, alignment, false);
}

void free_checked_impl(void* p, int kind, std::size_t size) {
  if (p != nullptr && BRISK_UNLIKELY(g_debug_blocks_may_exist.load(std::memory_order_acquire)) &&
      debug::release(p, static_cast<debug::Kind>(kind), size))
    return;
  free_inline(p);
}

std::size_t usable_size_impl(const void* p) {
  if (p == nullptr) return 0;
  std::size_t debug_size;
  if (BRISK_UNLIKELY(g_debug_blocks_may_exist.load(std::memory_order_acquire)) && debug::usable_size(p, &debug_size))
    return debug_size;
  Span* s;
  LargeHeader* lh;
  return checked_usable(p, &s, &lh);
}

}  // namespace brisk
