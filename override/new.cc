// Replaces every C++ operator new and delete of the process (malloc.cc replaces the C
// functions). Built only into libbrisk.so and libbrisk.a (BRISK_OVERRIDE); brisk_core keeps the
// system's. Each is a thin shell over the inline entry points (entry.h).
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

#include <new>

#include "core/platform.h"
#include "debug/block.h"
#include "override/entry.h"
#include "threadcache/debug_switch.h"

#ifndef BRISK_OVERRIDE
#error "override.cc is built only into the replacing libraries"
#endif

using namespace brisk;

// ---- The C++ runtime, reached only when the process has one ----------------------------------
// libbrisk.so does not link libstdc++: preloaded into a C program it loads nothing but libc.
// A C++ program has libstdc++ loaded before its first operator new, so these weak references
// resolve to it at load time; dlsym finds it when it was loaded later (dlopen of a C++ module).
// This file is built without exceptions: operator new raises std::bad_alloc through the
// Itanium C++ ABI (__cxa_allocate_exception + __cxa_throw with bad_alloc's vtable, type_info
// and destructor), and no frame here needs a landing pad, so the entry points stay leaf-like
// and tail-call their slow paths.
extern "C" {
using NewHandler = void (*)();
NewHandler cxx_get_new_handler() __asm__("_ZSt15get_new_handlerv") __attribute__((weak));
void* cxx_allocate_exception(size_t) __asm__("__cxa_allocate_exception") __attribute__((weak));
void cxx_throw(void*, void*, void (*)(void*)) __asm__("__cxa_throw") __attribute__((weak, noreturn));
extern char cxx_bad_alloc_typeinfo[] __asm__("_ZTISt9bad_alloc") __attribute__((weak));
extern void* cxx_bad_alloc_vtable[] __asm__("_ZTVSt9bad_alloc") __attribute__((weak));
void cxx_bad_alloc_destructor(void*) __asm__("_ZNSt9bad_allocD1Ev") __attribute__((weak));
}

namespace {

template <typename T>
T runtime_symbol(T weak_ref, const char* name) {
  if (weak_ref != nullptr) return weak_ref;
  return reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
}

NewHandler current_new_handler() {
  auto get = runtime_symbol(&cxx_get_new_handler, "_ZSt15get_new_handlerv");
  return get != nullptr ? get() : nullptr;  // no C++ runtime: no handler can have been set
}

[[noreturn]] BRISK_NOINLINE void throw_bad_alloc() {
  auto allocate = runtime_symbol(&cxx_allocate_exception, "__cxa_allocate_exception");
  auto raise = runtime_symbol(&cxx_throw, "__cxa_throw");
  auto* typeinfo = runtime_symbol(static_cast<char*>(cxx_bad_alloc_typeinfo), "_ZTISt9bad_alloc");
  auto** vtable = runtime_symbol(static_cast<void**>(cxx_bad_alloc_vtable), "_ZTVSt9bad_alloc");
  auto destructor = runtime_symbol(&cxx_bad_alloc_destructor, "_ZNSt9bad_allocD1Ev");
  if (allocate == nullptr || raise == nullptr || typeinfo == nullptr || vtable == nullptr ||
      destructor == nullptr) {
    static const char kMsg[] = "brisk: operator new is out of memory and no C++ runtime is loaded\n";
    platform::write_stderr(kMsg, sizeof kMsg - 1);
    platform::abort_process();
  }
  // A std::bad_alloc is one vtable pointer; it points past the offset-to-top and type_info
  // slots, at the first virtual function (Itanium C++ ABI, 2.5.2).
  void* exception = allocate(sizeof(void*));
  *static_cast<void**>(exception) = vtable + 2;
  raise(exception, typeinfo, destructor);
  __builtin_unreachable();  // __cxa_throw does not return; the pointer type cannot say so
}

void* retry_allocation(std::size_t size, std::size_t alignment) {
  return alignment <= kMinAlign ? malloc_inline(size) : aligned_alloc_impl(alignment, size);
}

// operator new's failure path: call the new_handler until an allocation succeeds or there is
// no handler left, then throw std::bad_alloc, as [new.delete.single] says. A handler that
// throws (bad_alloc, usually) leaves through here.
template <debug::Kind kKind>
BRISK_NOINLINE void* new_failed(std::size_t size, std::size_t alignment) {
  debug::KindScope scope(kKind);
  for (;;) {
    NewHandler handler = current_new_handler();
    if (handler == nullptr) throw_bad_alloc();
    handler();
    if (void* p = retry_allocation(size, alignment)) return p;
  }
}

// The nothrow forms return nullptr where the throwing ones throw, including when a new_handler
// throws. Catching needs the C++ runtime, so the handler loop runs inside libstdc++'s own
// nothrow operator new (found after brisk with RTLD_NEXT), which calls brisk's throwing
// operator new in a try block. Without a handler there is nothing to catch.
BRISK_NOINLINE void* new_failed_nothrow(std::size_t size, std::size_t alignment) noexcept {
  if (current_new_handler() == nullptr) return nullptr;
  const std::nothrow_t tag{};  // not std::nothrow: that object lives in libstdc++
  if (alignment <= kMinAlign) {
    using Fn = void* (*)(std::size_t, const std::nothrow_t&) noexcept;
    auto next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "_ZnwmRKSt9nothrow_t"));
    if (next != nullptr) return next(size, tag);
  } else {
    using Fn = void* (*)(std::size_t, std::align_val_t, const std::nothrow_t&) noexcept;
    auto next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "_ZnwmSt11align_val_tRKSt9nothrow_t"));
    if (next != nullptr) return next(size, static_cast<std::align_val_t>(alignment), tag);
  }
  // No libstdc++ after brisk to catch for us (-static-libstdc++, a static executable): run the
  // handler loop here. A handler that throws then leaves through this noexcept function, which
  // terminates, as an exception escaping any noexcept function does.
  for (NewHandler handler = current_new_handler(); handler != nullptr; handler = current_new_handler()) {
    handler();
    if (void* p = retry_allocation(size, alignment)) return p;
  }
  return nullptr;
}

// operator new's slow paths name the kind, so that a debug block made there records it and
// its free by the wrong function is reported; the fast paths are malloc's.
template <debug::Kind kKind>
BRISK_NOINLINE void* refill_new(Heap* h, unsigned c, std::size_t size) {
  debug::KindScope scope(kKind);
  return alloc_refill(h, c, size);
}
template <debug::Kind kKind>
BRISK_NOINLINE void* alloc_big_new(std::size_t size) {
  debug::KindScope scope(kKind);
  return alloc_big(size, kMinAlign, false);
}
// size: what a sized operator delete was given (debug::kUnsized: an unsized one), checked against a debug
// block's size; the fast path passes it along without looking at it.
template <debug::Kind kKind>
BRISK_NOINLINE void sized_delete_slow(void* p, std::size_t size) {
  if (p != nullptr && BRISK_UNLIKELY(g_debug_blocks_may_exist.load(std::memory_order_acquire)) &&
      debug::release(p, kKind, size))
    return;
  free_slow(p);
}
template <debug::Kind kKind>
BRISK_NOINLINE void delete_slow(void* p) {
  sized_delete_slow<kKind>(p, debug::kUnsized);
}

template <debug::Kind kKind>
BRISK_ALWAYS_INLINE void delete_impl(void* p) {
  free_fast<delete_slow<kKind>>(p);
}
template <debug::Kind kKind>
BRISK_ALWAYS_INLINE void sized_delete_impl(void* p, std::size_t size) {
  free_fast<sized_delete_slow<kKind>>(p, size);
}

template <debug::Kind kKind>
BRISK_ALWAYS_INLINE void* new_impl(std::size_t size) {
  void* p = BRISK_LIKELY(size <= kSmallMax) ? alloc_small<refill_new<kKind>>(t_heap, size_to_class(size), size)
                                            : alloc_big_new<kKind>(size);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed<kKind>(size, kMinAlign);
  return p;
}

template <debug::Kind kKind>
BRISK_ALWAYS_INLINE void* new_aligned_impl(std::size_t size, std::align_val_t al) {
  debug::KindScope scope(kKind);
  void* p = aligned_alloc_impl(static_cast<std::size_t>(al), size);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed<kKind>(size, static_cast<std::size_t>(al));
  return p;
}

template <debug::Kind kKind>
BRISK_ALWAYS_INLINE void* new_nothrow_impl(std::size_t size, std::size_t alignment) noexcept {
  debug::KindScope scope(kKind);
  void* p = retry_allocation(size, alignment);
  if (BRISK_UNLIKELY(p == nullptr)) return new_failed_nothrow(size, alignment);
  return p;
}


}  // namespace


BRISK_EXPORT void* operator new(std::size_t size) { return new_impl<debug::Kind::kNew>(size); }
BRISK_EXPORT void* operator new[](std::size_t size) { return new_impl<debug::Kind::kNewArray>(size); }
BRISK_EXPORT void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return new_nothrow_impl<debug::Kind::kNew>(size, kMinAlign);
}
BRISK_EXPORT void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return new_nothrow_impl<debug::Kind::kNewArray>(size, kMinAlign);
}
BRISK_EXPORT void* operator new(std::size_t size, std::align_val_t al) {
  return new_aligned_impl<debug::Kind::kNew>(size, al);
}
BRISK_EXPORT void* operator new[](std::size_t size, std::align_val_t al) {
  return new_aligned_impl<debug::Kind::kNewArray>(size, al);
}
BRISK_EXPORT void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return new_nothrow_impl<debug::Kind::kNew>(size, static_cast<std::size_t>(al));
}
BRISK_EXPORT void* operator new[](std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return new_nothrow_impl<debug::Kind::kNewArray>(size, static_cast<std::size_t>(al));
}

BRISK_EXPORT void operator delete(void* p) noexcept { delete_impl<debug::Kind::kNew>(p); }
BRISK_EXPORT void operator delete[](void* p) noexcept { delete_impl<debug::Kind::kNewArray>(p); }
BRISK_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept { delete_impl<debug::Kind::kNew>(p); }
BRISK_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept { delete_impl<debug::Kind::kNewArray>(p); }
BRISK_EXPORT void operator delete(void* p, std::size_t size) noexcept { sized_delete_impl<debug::Kind::kNew>(p, size); }
BRISK_EXPORT void operator delete[](void* p, std::size_t size) noexcept { sized_delete_impl<debug::Kind::kNewArray>(p, size); }
BRISK_EXPORT void operator delete(void* p, std::align_val_t) noexcept { delete_impl<debug::Kind::kNew>(p); }
BRISK_EXPORT void operator delete[](void* p, std::align_val_t) noexcept { delete_impl<debug::Kind::kNewArray>(p); }
BRISK_EXPORT void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { delete_impl<debug::Kind::kNew>(p); }
BRISK_EXPORT void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { delete_impl<debug::Kind::kNewArray>(p); }
BRISK_EXPORT void operator delete(void* p, std::size_t size, std::align_val_t) noexcept { sized_delete_impl<debug::Kind::kNew>(p, size); }
BRISK_EXPORT void operator delete[](void* p, std::size_t size, std::align_val_t) noexcept { sized_delete_impl<debug::Kind::kNewArray>(p, size); }
