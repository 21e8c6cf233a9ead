// Replaces every allocation entry point of the process: the C allocation functions glibc
// exports and every C++ operator new and delete. Built only into libbrisk.so and libbrisk.a
// (BRISK_OVERRIDE); brisk_core keeps the system malloc.
//
// All of them must be here: a missing one (pvalloc, say) would let glibc's version hand a
// foreign pointer to brisk's free. Each is a thin shell over the inline entry points, so
// malloc's body is the thread cache's fast path.
#include <errno.h>
#include <stddef.h>

#include <new>

#include "threadcache/alloc_inline.h"

#ifndef BRISK_OVERRIDE
#error "override.cc is built only into the replacing libraries"
#endif

using namespace brisk;

namespace {

// operator new's failure path: call the new_handler until it gives up (it throws bad_alloc)
// or there is none left, as [new.delete.single] says.
BRISK_NOINLINE void* new_failed(std::size_t size, std::size_t alignment) {
  for (;;) {
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
    void* p = alignment <= kMinAlign ? malloc_inline(size) : aligned_alloc_impl(alignment, size);
    if (p != nullptr) return p;
  }
}

BRISK_NOINLINE void* new_failed_nothrow(std::size_t size, std::size_t alignment) noexcept {
  try {
    return new_failed(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

BRISK_ALWAYS_INLINE void* new_impl(std::size_t size) {
  void* p = malloc_inline(size);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed(size, kMinAlign);
  return p;
}

BRISK_ALWAYS_INLINE void* new_aligned_impl(std::size_t size, std::align_val_t al) {
  void* p = aligned_alloc_impl(static_cast<std::size_t>(al), size);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed(size, static_cast<std::size_t>(al));
  return p;
}

BRISK_ALWAYS_INLINE void* new_nothrow_impl(std::size_t size, std::size_t alignment) noexcept {
  void* p = alignment <= kMinAlign ? malloc_inline(size) : aligned_alloc_impl(alignment, size);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed_nothrow(size, alignment);
  return p;
}

std::size_t round_to_page(std::size_t n, bool* overflow) {
  *overflow = n > SIZE_MAX - (kOsPageSize - 1);
  return (n + kOsPageSize - 1) & ~(kOsPageSize - 1);
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

BRISK_EXPORT size_t malloc_usable_size(void* p) noexcept { return usable_size_impl(p); }
BRISK_EXPORT void free_sized(void* p, size_t) noexcept { free_inline(p); }
BRISK_EXPORT void free_aligned_sized(void* p, size_t, size_t) noexcept { free_inline(p); }

}  // extern "C"

BRISK_EXPORT void* operator new(std::size_t size) { return new_impl(size); }
BRISK_EXPORT void* operator new[](std::size_t size) { return new_impl(size); }
BRISK_EXPORT void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return new_nothrow_impl(size, kMinAlign);
}
BRISK_EXPORT void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return new_nothrow_impl(size, kMinAlign);
}
BRISK_EXPORT void* operator new(std::size_t size, std::align_val_t al) { return new_aligned_impl(size, al); }
BRISK_EXPORT void* operator new[](std::size_t size, std::align_val_t al) { return new_aligned_impl(size, al); }
BRISK_EXPORT void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return new_nothrow_impl(size, static_cast<std::size_t>(al));
}
BRISK_EXPORT void* operator new[](std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return new_nothrow_impl(size, static_cast<std::size_t>(al));
}

BRISK_EXPORT void operator delete(void* p) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete(void* p, std::size_t) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p, std::size_t) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete(void* p, std::align_val_t) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p, std::align_val_t) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete(void* p, std::size_t, std::align_val_t) noexcept { free_inline(p); }
BRISK_EXPORT void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { free_inline(p); }
