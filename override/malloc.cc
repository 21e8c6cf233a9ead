// Replaces every C allocation function glibc exports (new.cc replaces operator new and
// delete). Built only into libbrisk.so and libbrisk.a (BRISK_OVERRIDE); brisk_core keeps the
// system malloc.
//
// All of them must be here: a missing one (pvalloc, say) would let glibc's version hand a
// foreign pointer to brisk's free. Each is a thin shell over the inline entry points
// (entry.h), so malloc's body is the thread cache's fast path; the rules that differ between
// them (memalign's rounding, posix_memalign's result, pvalloc's page rounding,
// reallocarray's overflow) are here. glibc's __libc_* names for them are aliases.
#include <brisk/brisk.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/options.h"
#include "core/platform.h"
#include "override/entry.h"
#include "override/stats_print.h"

#ifndef BRISK_OVERRIDE
#error "malloc.cc is built only into the replacing libraries"
#endif

using namespace brisk;

namespace {

std::size_t round_to_page(std::size_t n, bool* overflow) {
  *overflow = n > SIZE_MAX - (kOsPageSize - 1);
  return (n + kOsPageSize - 1) & ~(kOsPageSize - 1);
}

// glibc's mallinfo fields in brisk's terms (the README's "Statistics" has the table): the
// "arena" is the chunks, "mmapped" space the large blocks.
struct mallinfo2 brisk_mallinfo2() {
  brisk_stats s;
  brisk_get_stats(&s);
  struct mallinfo2 m = {};
  m.arena = s.chunk_bytes_mapped;
  m.ordblks = s.chunk_bytes_free / kPageSize;  // free 64 KiB pages in live chunks
  m.hblks = s.large_live_blocks;
  m.hblkhd = s.large_bytes_mapped;
  m.uordblks = s.bytes_in_use;
  m.fordblks = s.thread_cache_bytes + s.central_pool_bytes + s.remote_queued_bytes + s.chunk_bytes_free;
  m.keepcost = s.chunk_bytes_free_resident + s.large_cache_resident_bytes;  // what malloc_trim returns
  return m;
}

int clamp_to_int(size_t v) { return v > INT_MAX ? INT_MAX : static_cast<int>(v); }

// At load, in the file every program that links brisk's malloc links: every BRISK_* variable is
// read, so that an invalid one is reported at start-up (BRISK_LARGE_CACHE_BYTES=1q in a program
// that never frees a large block was never reported). Then, for BRISK_STATS=1|2 (the statistics,
// as a table or JSON, on stderr at exit), the duplicate of descriptor 2 the table is written to
// once the program has closed it: coreutils' close_stdout fcloses stderr in an exit handler,
// before the destructor below, which therefore writes to the descriptor, not through stdio.
__attribute__((constructor)) void read_options_at_load() {
  options::read_environment();
  if (options::get(options::Id::kStats) != 0) platform::keep_stderr();
}
__attribute__((destructor)) void print_stats_at_exit() {
  std::int64_t mode = options::get(options::Id::kStats);
  if (mode != 0) brisk::print_stats_to_stderr(mode == 2 ? 1 : 0);
}

}  // namespace

extern "C" {

BRISK_EXPORT void* malloc(size_t size) noexcept { return malloc_inline(size); }
BRISK_EXPORT void free(void* p) noexcept { free_inline(p); }
BRISK_EXPORT void cfree(void* p) noexcept { free_inline(p); }
BRISK_EXPORT void* calloc(size_t count, size_t size) noexcept { return calloc_inline(count, size); }
BRISK_EXPORT void* realloc(void* p, size_t size) noexcept { return realloc_impl(p, size); }

BRISK_EXPORT void* reallocarray(void* p, size_t count, size_t size) noexcept {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc_impl(p, total);
}

BRISK_EXPORT void* aligned_alloc(size_t alignment, size_t size) noexcept {
  return aligned_alloc_impl(alignment, size);
}

// glibc's memalign accepts any alignment and rounds it up to a power of two.
BRISK_EXPORT void* memalign(size_t alignment, size_t size) noexcept {
  if (alignment <= kMinAlign) return malloc_inline(size);
  if ((alignment & (alignment - 1)) != 0) {
    if (alignment > (SIZE_MAX >> 1) + 1) {
      errno = EINVAL;
      return nullptr;
    }
    alignment = size_t{1} << (64 - __builtin_clzll(alignment));
  }
  return aligned_alloc_impl(alignment, size);
}

BRISK_EXPORT int posix_memalign(void** out, size_t alignment, size_t size) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = aligned_alloc_impl(alignment, size);
  // ENOMEM is both returned and left in errno, as glibc does: programs written against glibc
  // (its tst-malloc-thread-fail among them) read errno after a failure.
  if (p == nullptr) return errno;
  *out = p;
  return 0;
}

BRISK_EXPORT void* valloc(size_t size) noexcept { return aligned_alloc_impl(kOsPageSize, size); }

BRISK_EXPORT void* pvalloc(size_t size) noexcept {
  bool overflow;
  size_t rounded = round_to_page(size == 0 ? 1 : size, &overflow);
  if (overflow) {
    errno = ENOMEM;
    return nullptr;
  }
  return aligned_alloc_impl(kOsPageSize, rounded);
}

// glibc exports its allocator under these names as well (GLIBC_2.2.5; its headers declare
// none), and some programs and preloaded shims call them directly: a tracing shim's malloc that
// runs before dlsym(RTLD_NEXT, "malloc") has answered commonly falls back on __libc_malloc.
// Served by glibc, such a block would reach brisk's free as an invalid pointer, and a brisk
// block given to __libc_free would reach glibc's, so they are the same entry points under a
// second name (copy: the target's attributes as glibc declares them, malloc and alloc_size).
#define BRISK_ALIAS_OF(f) __attribute__((alias(#f), copy(f)))
BRISK_EXPORT void* __libc_malloc(size_t size) noexcept BRISK_ALIAS_OF(malloc);
BRISK_EXPORT void __libc_free(void* p) noexcept BRISK_ALIAS_OF(free);
BRISK_EXPORT void* __libc_calloc(size_t count, size_t size) noexcept BRISK_ALIAS_OF(calloc);
BRISK_EXPORT void* __libc_realloc(void* p, size_t size) noexcept BRISK_ALIAS_OF(realloc);
BRISK_EXPORT void* __libc_memalign(size_t alignment, size_t size) noexcept BRISK_ALIAS_OF(memalign);
BRISK_EXPORT void* __libc_valloc(size_t size) noexcept BRISK_ALIAS_OF(valloc);
BRISK_EXPORT void* __libc_pvalloc(size_t size) noexcept BRISK_ALIAS_OF(pvalloc);

#undef BRISK_ALIAS_OF

BRISK_EXPORT size_t malloc_usable_size(void* p) noexcept { return usable_size_impl(p); }
BRISK_EXPORT void free_sized(void* p, size_t size) noexcept { free_checked_impl(p, 0, size); }
// glibc's contract: 1 if memory was given back to the OS, else 0. brisk keeps no top-of-heap
// padding, so pad has nothing to spare.
BRISK_EXPORT int malloc_trim(size_t) noexcept { return brisk_trim() > 0 ? 1 : 0; }
BRISK_EXPORT void free_aligned_sized(void* p, size_t, size_t size) noexcept { free_checked_impl(p, 0, size); }

// glibc's statistics calls would describe glibc's own, empty, arena: brisk answers them.
BRISK_EXPORT struct mallinfo2 mallinfo2() noexcept { return brisk_mallinfo2(); }
BRISK_EXPORT struct mallinfo mallinfo() noexcept {
  struct mallinfo2 m2 = brisk_mallinfo2();
  struct mallinfo m = {};
  m.arena = clamp_to_int(m2.arena);
  m.ordblks = clamp_to_int(m2.ordblks);
  m.hblks = clamp_to_int(m2.hblks);
  m.hblkhd = clamp_to_int(m2.hblkhd);
  m.uordblks = clamp_to_int(m2.uordblks);
  m.fordblks = clamp_to_int(m2.fordblks);
  m.keepcost = clamp_to_int(m2.keepcost);
  return m;
}
BRISK_EXPORT void malloc_stats() noexcept { brisk_print_stats(stderr, 0); }
// options must be 0: else -1 with errno EINVAL, as malloc_info(3) documents (glibc 2.36 itself
// returns the value EINVAL and leaves errno alone; a caller that tests for nonzero sees a failure
// either way). XML in glibc's schema, free blocks by class.
BRISK_EXPORT int malloc_info(int options, FILE* out) noexcept {
  if (options != 0) {
    errno = EINVAL;
    return -1;
  }
  print_malloc_info(out);
  return 0;
}

}  // extern "C"
