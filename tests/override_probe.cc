// Checks that brisk replaces every allocation entry point of the process, and that each one
// behaves as the README promises. Built three ways (tests/CMakeLists.txt):
//   override_probe          linked without brisk, run with LD_PRELOAD=libbrisk.so
//   override_probe_linked   linked with brisk::brisk (libbrisk.so)
//   override_probe_static   linked with brisk::brisk_static (BRISK_PROBE_STATIC: the entry
//                           points live in the executable itself)
// Prints one line per failed check and exits 1 if any failed.
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"

#ifdef BRISK_PROBE_STATIC
// glibc 2.36 declares neither; brisk must define both (C23).
extern "C" void free_sized(void* ptr, size_t size);
extern "C" void free_aligned_sized(void* ptr, size_t alignment, size_t size);
extern "C" size_t brisk_usable_size(const void* ptr);
#endif

namespace {

using brisk_test::g_failures;

size_t Opaque(size_t n) {
  volatile size_t v = n;
  return v;
}

using UsableSizeFn = size_t (*)(const void*);
UsableSizeFn g_brisk_usable_size = nullptr;
// free_sized and free_aligned_sized: glibc 2.36 has neither, so a program linked without brisk
// finds them at run time.
void (*g_free_sized)(void*, size_t) = nullptr;
void (*g_free_aligned_sized)(void*, size_t, size_t) = nullptr;

bool Aligned(const void* p, size_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

void Fill(void* p, size_t n, unsigned seed) {
  unsigned char* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(seed + i * 131 + (i >> 8));
}
bool Verify(const void* p, size_t n, unsigned seed) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != static_cast<unsigned char>(seed + i * 131 + (i >> 8))) return false;
  return true;
}

// A block from any entry point: non-null, aligned, usable >= size according to both
// malloc_usable_size and brisk_usable_size (which must agree: it is brisk's block), and
// writable over its whole usable size.
void CheckBlock(const char* what, void* p, size_t size, size_t alignment) {
  CHECK(p != nullptr, "%s(%zu) returned NULL", what, size);
  if (p == nullptr) return;
  CHECK(Aligned(p, alignment), "%s(%zu): %p not aligned to %zu", what, size, p, alignment);
  size_t usable = malloc_usable_size(p);
  CHECK(usable >= size, "%s(%zu): malloc_usable_size %zu", what, size, usable);
  size_t brisk_usable = g_brisk_usable_size(p);
  CHECK(brisk_usable == usable, "%s(%zu) = %p: brisk_usable_size %zu != malloc_usable_size %zu", what, size, p,
        brisk_usable, usable);
  Fill(p, usable, static_cast<unsigned>(size));
  CHECK(Verify(p, usable, static_cast<unsigned>(size)), "%s(%zu): contents not kept", what, size);
}

// ---- 1. every entry point resolves into brisk -------------------------------------------------

const char* const kEntryPoints[] = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign", "aligned_alloc",
    "valloc", "pvalloc", "malloc_usable_size", "malloc_trim", "free_sized", "free_aligned_sized", "cfree",
    "mallinfo", "mallinfo2", "malloc_stats", "malloc_info",
    // glibc's other names for its allocator (GLIBC_2.2.5), which programs and preloaded shims call
    "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign", "__libc_valloc",
    "__libc_pvalloc",
    // operator new: plain, nothrow, aligned, aligned nothrow; scalar and array
    "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
    // operator delete: plain, sized, aligned, sized aligned, nothrow, aligned nothrow
    "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

void LocalFunction() {}

// glibc keeps cfree only as a compatibility symbol, without a declaration.
extern "C" void cfree(void* p);

// glibc exports its allocator under these names too, and declares none of them.
extern "C" {
void* __libc_malloc(size_t size);
void __libc_free(void* p);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* p, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
}

#ifdef BRISK_PROBE_STATIC
// The static library's definitions, referenced directly (a symbol that no shared library
// references need not appear in the executable's dynamic symbol table).
void* DirectAddress(const std::string& name) {
  if (name == "free_sized") return reinterpret_cast<void*>(&free_sized);
  if (name == "free_aligned_sized") return reinterpret_cast<void*>(&free_aligned_sized);
  if (name == "cfree") return reinterpret_cast<void*>(&cfree);
  if (name == "malloc_trim") return reinterpret_cast<void*>(&malloc_trim);
  if (name == "mallinfo2") return reinterpret_cast<void*>(&mallinfo2);
  if (name == "malloc_stats") return reinterpret_cast<void*>(&malloc_stats);
  if (name == "malloc_info") return reinterpret_cast<void*>(&malloc_info);
  if (name == "__libc_malloc") return reinterpret_cast<void*>(&__libc_malloc);
  if (name == "__libc_free") return reinterpret_cast<void*>(&__libc_free);
  if (name == "__libc_calloc") return reinterpret_cast<void*>(&__libc_calloc);
  if (name == "__libc_realloc") return reinterpret_cast<void*>(&__libc_realloc);
  if (name == "__libc_memalign") return reinterpret_cast<void*>(&__libc_memalign);
  if (name == "__libc_valloc") return reinterpret_cast<void*>(&__libc_valloc);
  if (name == "__libc_pvalloc") return reinterpret_cast<void*>(&__libc_pvalloc);
  return nullptr;
}
#endif

void CheckResolution() {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&LocalFunction), &self);
  for (const char* name : kEntryPoints) {
    void* sym = dlsym(RTLD_DEFAULT, name);
#ifdef BRISK_PROBE_STATIC
    if (sym == nullptr) sym = DirectAddress(name);
#endif
    CHECK(sym != nullptr, "%s is not defined in the process", name);
    if (sym == nullptr) continue;
    Dl_info info{};
    CHECK(dladdr(sym, &info) != 0, "dladdr failed for %s", name);
#ifdef BRISK_PROBE_STATIC
    CHECK(info.dli_fbase == self.dli_fbase, "%s resolves into %s, not into the executable", name,
          info.dli_fname ? info.dli_fname : "?");
#else
    const char* file = info.dli_fname ? info.dli_fname : "";
    CHECK(strstr(file, "libbrisk.so") != nullptr, "%s resolves into %s, not libbrisk.so", name, file);
#endif
  }
#ifdef BRISK_PROBE_STATIC
  g_brisk_usable_size = &brisk_usable_size;
  g_free_sized = &free_sized;
  g_free_aligned_sized = &free_aligned_sized;
#else
  g_brisk_usable_size = reinterpret_cast<UsableSizeFn>(dlsym(RTLD_DEFAULT, "brisk_usable_size"));
  g_free_sized = reinterpret_cast<void (*)(void*, size_t)>(dlsym(RTLD_DEFAULT, "free_sized"));
  g_free_aligned_sized = reinterpret_cast<void (*)(void*, size_t, size_t)>(dlsym(RTLD_DEFAULT, "free_aligned_sized"));
#endif
  if (g_brisk_usable_size == nullptr || g_free_sized == nullptr || g_free_aligned_sized == nullptr) {
    fprintf(stderr, "FAIL: brisk_usable_size, free_sized or free_aligned_sized is not defined; cannot continue\n");
    fprintf(stderr, "override_probe: %d check(s) failed\n", g_failures + 1);
    exit(1);
  }
}

// ---- 2. the malloc family -----------------------------------------------------------------------

void CheckMallocFamily() {
  CHECK(malloc_usable_size(nullptr) == 0, "malloc_usable_size(NULL)");
  std::vector<void*> live;
  for (size_t s = 0; s < 5000; s += (s < 512 ? 1 : 37)) {
    void* p = malloc(Opaque(s));
    CheckBlock("malloc", p, s, 16);
    live.push_back(p);
    if (live.size() == 50) {
      for (void* q : live) free(q);
      live.clear();
    }
  }
  for (void* q : live) free(q);
  for (size_t s : {size_t{70000}, size_t{300000}, size_t{3} << 20, size_t{20} << 20}) {
    void* p = malloc(Opaque(s));
    CheckBlock("malloc", p, s, 16);
    free(p);
  }

  // calloc: fresh and reused memory is zeroed.
  for (int round = 0; round < 2; ++round) {
    for (size_t s : {size_t{8}, size_t{100}, size_t{4000}, size_t{70000}, size_t{2} << 20}) {
      void* d = malloc(s);
      memset(d, 0xEE, malloc_usable_size(d));
      free(d);
      unsigned char* z = static_cast<unsigned char*>(calloc(Opaque(s), 1));
      CHECK(z != nullptr, "calloc(%zu, 1)", s);
      if (z == nullptr) continue;
      bool zero = true;
      for (size_t i = 0; i < s; ++i) zero &= z[i] == 0;
      CHECK(zero, "calloc(%zu, 1) not zeroed", s);
      CheckBlock("calloc", z, s, 16);
      free(z);
    }
  }

  // realloc and reallocarray keep contents through small, medium and large sizes.
  const size_t chain[] = {10, 100, 3000, 50000, 600000, size_t{5} << 20, 70000, 500, 20};
  char* p = static_cast<char*>(malloc(chain[0]));
  Fill(p, chain[0], 9);
  for (size_t i = 1; i < sizeof chain / sizeof chain[0]; ++i) {
    char* q = static_cast<char*>(realloc(p, Opaque(chain[i])));
    CHECK(q != nullptr, "realloc to %zu", chain[i]);
    if (q == nullptr) return;
    size_t kept = chain[i] < chain[i - 1] ? chain[i] : chain[i - 1];
    CHECK(Verify(q, kept, static_cast<unsigned>(9 + i - 1)), "realloc %zu -> %zu lost contents", chain[i - 1],
          chain[i]);
    CheckBlock("realloc", q, chain[i], 16);
    Fill(q, chain[i], static_cast<unsigned>(9 + i));
    p = q;
  }
  free(p);
  int* arr = static_cast<int*>(reallocarray(nullptr, Opaque(10), sizeof(int)));
  CHECK(arr != nullptr, "reallocarray(NULL, 10, 4)");
  for (int i = 0; i < 10; ++i) arr[i] = i * 3;
  arr = static_cast<int*>(reallocarray(arr, Opaque(100000), sizeof(int)));
  CHECK(arr != nullptr, "reallocarray grow");
  if (arr != nullptr) {
    for (int i = 0; i < 10; ++i) CHECK(arr[i] == i * 3, "reallocarray lost element %d", i);
    CheckBlock("reallocarray", arr, 100000 * sizeof(int), 16);
  }
  free(arr);

  // free_sized with the requested size.
  for (size_t s : {size_t{24}, size_t{5000}, size_t{1} << 20}) {
    void* b = malloc(s);
    CheckBlock("malloc (for free_sized)", b, s, 16);
    g_free_sized(b, s);
  }
}

// The __libc_* names are brisk's allocator too: a block from one name is freed or resized by
// another (with glibc serving them, free of a __libc_malloc block is an invalid free in brisk).
void CheckLibcNames() {
  void* p = __libc_malloc(Opaque(100));
  CheckBlock("__libc_malloc", p, 100, 16);
  free(p);
  p = malloc(Opaque(200));
  CheckBlock("malloc", p, 200, 16);
  __libc_free(p);
  __libc_free(nullptr);
  unsigned char* z = static_cast<unsigned char*>(__libc_calloc(Opaque(300), 1));
  CHECK(z != nullptr, "__libc_calloc(300, 1)");
  if (z != nullptr) {
    bool zero = true;
    for (size_t i = 0; i < 300; ++i) zero &= z[i] == 0;
    CHECK(zero, "__libc_calloc(300, 1) not zeroed");
    Fill(z, 300, 5);
    void* q = __libc_realloc(z, Opaque(70000));
    CHECK(q != nullptr && Verify(q, 300, 5), "__libc_realloc 300 -> 70000 lost contents");
    if (q != nullptr) CheckBlock("__libc_realloc", q, 70000, 16);
    free(q);
  }
  p = __libc_memalign(Opaque(256), 1000);
  CheckBlock("__libc_memalign", p, 1000, 256);
  __libc_free(p);
  p = __libc_valloc(Opaque(10));
  CheckBlock("__libc_valloc", p, 10, 4096);
  free(p);
  p = __libc_pvalloc(Opaque(10));
  CheckBlock("__libc_pvalloc", p, 4096, 4096);
  __libc_free(p);
}

// ---- 3. the aligned family: every power of two from 1 to 1 MiB ------------------------------------

void CheckAlignedFamily() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t a = 1; a <= (size_t{1} << 20); a *= 2) {
    for (size_t s : {size_t{1}, a, a + 1, size_t{100}}) {
      void* p = memalign(Opaque(a), Opaque(s));
      CheckBlock("memalign", p, s, a);
      free(p);

      p = aligned_alloc(Opaque(a), Opaque(s));
      CheckBlock("aligned_alloc", p, s, a);
      g_free_aligned_sized(p, a, s);

      if (a >= sizeof(void*)) {
        p = nullptr;
        int rc = posix_memalign(&p, Opaque(a), Opaque(s));
        CHECK(rc == 0, "posix_memalign(%zu, %zu) = %d", a, s, rc);
        CheckBlock("posix_memalign", p, s, a);
        free(p);
      }

      p = ::operator new(Opaque(s), std::align_val_t(a));
      CheckBlock("operator new(align)", p, s, a);
      ::operator delete(p, s, std::align_val_t(a));

      p = ::operator new[](Opaque(s), std::align_val_t(a));
      CheckBlock("operator new[](align)", p, s, a);
      ::operator delete[](p, std::align_val_t(a));

      p = ::operator new(Opaque(s), std::align_val_t(a), std::nothrow);
      CheckBlock("operator new(align, nothrow)", p, s, a);
      ::operator delete(p, std::align_val_t(a), std::nothrow);

      p = ::operator new[](Opaque(s), std::align_val_t(a), std::nothrow);
      CheckBlock("operator new[](align, nothrow)", p, s, a);
      ::operator delete[](p, s, std::align_val_t(a));
    }
  }
  for (size_t s : {size_t{1}, size_t{100}, page - 1, page, page + 1, 3 * page + 5, size_t{1} << 20}) {
    void* p = valloc(Opaque(s));
    CheckBlock("valloc", p, s, page);
    free(p);
    p = pvalloc(Opaque(s));
    size_t rounded = (s + page - 1) / page * page;
    CheckBlock("pvalloc", p, rounded, page);  // usable size >= n rounded up to a page
    free(p);
  }
}

// ---- 4. operator new ------------------------------------------------------------------------------

void CheckOperatorNew() {
  for (size_t s : {size_t{0}, size_t{1}, size_t{16}, size_t{200}, size_t{5000}, size_t{100000}, size_t{4} << 20}) {
    void* p = ::operator new(Opaque(s));
    CheckBlock("operator new", p, s, 16);
    ::operator delete(p, s);
    p = ::operator new[](Opaque(s));
    CheckBlock("operator new[]", p, s, 16);
    ::operator delete[](p);
    p = ::operator new(Opaque(s), std::nothrow);
    CheckBlock("operator new(nothrow)", p, s, 16);
    ::operator delete(p);
    p = ::operator new[](Opaque(s), std::nothrow);
    CheckBlock("operator new[](nothrow)", p, s, 16);
    ::operator delete[](p, s);
  }
  // new-expressions and containers go through the replaced operators.
  std::vector<std::string> strings;
  for (int i = 0; i < 2000; ++i) strings.push_back(std::string(static_cast<size_t>(i % 300) + 20, 'a' + i % 26));
  for (int i = 0; i < 2000; ++i)
    CHECK(strings[i].size() == static_cast<size_t>(i % 300) + 20 && strings[i][i % 7] == 'a' + i % 26,
          "string %d damaged", i);
  long* one = new long(42);
  CheckBlock("new long", one, sizeof(long), 8);
  delete one;
}

// ---- 5. allocations made inside libc and libstdc++ are brisk's blocks ---------------------------

void CheckLibraryInternals() {
  char* dup = strdup("allocated by libc's strdup, which calls malloc internally");
  CheckBlock("strdup", dup, strlen("allocated by libc's strdup, which calls malloc internally") + 1, 16);
  free(dup);
  char* line = nullptr;
  size_t cap = 0;
  FILE* f = fmemopen(const_cast<char*>("a line of text\n"), 15, "r");
  CHECK(f != nullptr, "fmemopen");
  if (f != nullptr) {
    CHECK(getline(&line, &cap, f) > 0, "getline");
    CheckBlock("getline buffer", line, cap, 16);
    free(line);
    fclose(f);
  }
  // std::ostringstream::str() copies inside libstdc++.so.
  std::ostringstream os;
  os << std::string(5000, 'q');
  std::string s = os.str();
  CheckBlock("libstdc++ string", s.data(), s.size() + 1, 16);

  // glibc's own heap must stay (almost) untouched while the program allocates 8 MiB through
  // malloc and new: glibc's mallinfo2 reports only memory glibc's malloc handed out. (Taken from
  // libc.so itself: the process's mallinfo2 is brisk's.)
  using MallinfoFn = struct mallinfo2 (*)();
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  MallinfoFn mi = libc != nullptr ? reinterpret_cast<MallinfoFn>(dlsym(libc, "mallinfo2")) : nullptr;
  CHECK(mi != nullptr, "glibc's mallinfo2 not found");
  Dl_info info{};
  if (mi != nullptr && dladdr(reinterpret_cast<void*>(mi), &info) && info.dli_fname &&
      strstr(info.dli_fname, "libc.so") != nullptr) {
    struct mallinfo2 before = mi();
    std::vector<void*> blocks;
    for (int i = 0; i < 4096; ++i) blocks.push_back(i % 2 ? malloc(1024) : ::operator new(1024));
    struct mallinfo2 after = mi();
    size_t grew = (after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd);
    CHECK(grew < (size_t{1} << 20), "glibc's heap grew by %zu bytes: glibc, not brisk, served malloc/new", grew);
    for (int i = 0; i < 4096; ++i) {
      if (i % 2) free(blocks[i]);
      else ::operator delete(blocks[i]);
    }
  }
}

// ---- 6. the bad-input table ----------------------------------------------------------------------

void CheckErrno() {
  for (size_t s : {SIZE_MAX, size_t{PTRDIFF_MAX} + 1}) {
    errno = 0;
    void* p = malloc(Opaque(s));
    CHECK(p == nullptr && errno == ENOMEM, "malloc(%zu) = %p, errno %d", s, p, errno);
    errno = 0;
    p = calloc(Opaque(s), 1);
    CHECK(p == nullptr && errno == ENOMEM, "calloc(%zu, 1) = %p, errno %d", s, p, errno);
  }
  const size_t overflow[][2] = {{SIZE_MAX, 2}, {size_t{1} << 33, size_t{1} << 33}, {3, SIZE_MAX / 2}};
  for (const auto& c : overflow) {
    errno = 0;
    void* p = calloc(Opaque(c[0]), Opaque(c[1]));
    CHECK(p == nullptr && errno == ENOMEM, "calloc(%zu, %zu) = %p, errno %d", c[0], c[1], p, errno);
    errno = 0;
    p = reallocarray(nullptr, Opaque(c[0]), Opaque(c[1]));
    CHECK(p == nullptr && errno == ENOMEM, "reallocarray(NULL, %zu, %zu) = %p, errno %d", c[0], c[1], p, errno);
  }
  for (size_t start : {size_t{48}, size_t{100000}, size_t{3} << 20}) {
    char* p = static_cast<char*>(malloc(start));
    Fill(p, start, 77);
    errno = 0;
    void* q = realloc(p, Opaque(SIZE_MAX));
    CHECK(q == nullptr && errno == ENOMEM, "realloc(p, SIZE_MAX) = %p, errno %d", q, errno);
    errno = 0;
    q = reallocarray(p, Opaque(SIZE_MAX), Opaque(2));
    CHECK(q == nullptr && errno == ENOMEM, "reallocarray(p, SIZE_MAX, 2) = %p, errno %d", q, errno);
    CHECK(Verify(p, start, 77), "failed realloc of a %zu-byte block damaged it", start);
    CHECK(malloc_usable_size(p) >= start, "failed realloc shrank the block");
    free(p);
  }
  for (size_t a : {size_t{0}, size_t{3}, size_t{24}, size_t{100}, SIZE_MAX}) {
    errno = 0;
    void* p = aligned_alloc(Opaque(a), Opaque(64));
    CHECK(p == nullptr && errno == EINVAL, "aligned_alloc(%zu, 64) = %p, errno %d", a, p, errno);
  }
  for (size_t a : {size_t{0}, size_t{1}, size_t{4}, size_t{24}, size_t{100}}) {
    void* p = reinterpret_cast<void*>(0x1);
    errno = 0;
    int rc = posix_memalign(&p, Opaque(a), Opaque(64));
    CHECK(rc == EINVAL && errno == 0, "posix_memalign(%zu) returned %d, errno %d: not EINVAL, errno untouched", a,
          rc, errno);
  }
  {
    // glibc sets errno as well as returning ENOMEM, and programs written against it read errno.
    void* p = nullptr;
    errno = 0;
    int rc = posix_memalign(&p, Opaque(64), Opaque(SIZE_MAX));
    CHECK(rc == ENOMEM && errno == ENOMEM, "posix_memalign(64, SIZE_MAX) returned %d, errno %d: not ENOMEM", rc,
          errno);
  }
  bool threw = false;
  try {
    void* p = ::operator new(Opaque(SIZE_MAX));
    ::operator delete(p);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  CHECK(threw, "operator new(SIZE_MAX) did not throw std::bad_alloc");
  threw = false;
  try {
    void* p = ::operator new[](Opaque(size_t{PTRDIFF_MAX} + 1), std::align_val_t(64));
    ::operator delete[](p, std::align_val_t(64));
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  CHECK(threw, "aligned operator new[](PTRDIFF_MAX+1) did not throw std::bad_alloc");
  void* p = ::operator new(Opaque(SIZE_MAX), std::nothrow);
  CHECK(p == nullptr, "nothrow operator new(SIZE_MAX) = %p", p);
  p = ::operator new[](Opaque(SIZE_MAX), std::nothrow);
  CHECK(p == nullptr, "nothrow operator new[](SIZE_MAX) = %p", p);
  p = ::operator new(Opaque(SIZE_MAX), std::align_val_t(4096), std::nothrow);
  CHECK(p == nullptr, "nothrow aligned operator new(SIZE_MAX) = %p", p);
}

// ---- the new_handler loop ([new.delete.single]) --------------------------------------------------

int g_handler_calls = 0;
struct HandlerGaveUp : std::bad_alloc {};

void GiveUpOnThirdCall() {
  if (++g_handler_calls == 3) std::set_new_handler(nullptr);
}
void ThrowFromHandler() {
  ++g_handler_calls;
  throw HandlerGaveUp();
}

// operator new calls the handler until it removes itself, then throws bad_alloc; a handler's
// own exception leaves operator new as it is; the nothrow forms return nullptr in both cases.
void CheckNewHandler() {
  struct Case {
    const char* name;
    void* (*call)();
  };
  const Case throwing[] = {
      {"operator new", [] { return ::operator new(Opaque(SIZE_MAX)); }},
      {"operator new[]", [] { return ::operator new[](Opaque(SIZE_MAX)); }},
      {"aligned operator new", [] { return ::operator new(Opaque(SIZE_MAX), std::align_val_t(256)); }},
  };
  for (const Case& c : throwing) {
    g_handler_calls = 0;
    std::set_new_handler(GiveUpOnThirdCall);
    bool threw = false;
    try {
      ::operator delete(c.call());
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    CHECK(threw && g_handler_calls == 3, "%s: threw %d after %d handler calls, not bad_alloc after 3",
          c.name, threw, g_handler_calls);

    g_handler_calls = 0;
    std::set_new_handler(ThrowFromHandler);
    bool own = false;
    try {
      ::operator delete(c.call());
    } catch (const HandlerGaveUp&) {
      own = true;
    } catch (...) {
    }
    CHECK(own && g_handler_calls == 1, "%s: the handler's exception did not come through (%d calls)",
          c.name, g_handler_calls);
  }
  const Case nothrow[] = {
      {"nothrow operator new", [] { return ::operator new(Opaque(SIZE_MAX), std::nothrow); }},
      {"nothrow operator new[]", [] { return ::operator new[](Opaque(SIZE_MAX), std::nothrow); }},
      {"nothrow aligned operator new",
       [] { return ::operator new(Opaque(SIZE_MAX), std::align_val_t(256), std::nothrow); }},
  };
  for (const Case& c : nothrow) {
    for (auto handler : {GiveUpOnThirdCall, ThrowFromHandler}) {
      g_handler_calls = 0;
      std::set_new_handler(handler);
      void* p = c.call();
      int want = handler == GiveUpOnThirdCall ? 3 : 1;
      CHECK(p == nullptr && g_handler_calls == want, "%s: %p after %d handler calls, not nullptr after %d",
            c.name, p, g_handler_calls, want);
    }
  }
  std::set_new_handler(nullptr);
}

}  // namespace

int main() {
  CheckResolution();
  CheckNewHandler();
  CheckMallocFamily();
  CheckLibcNames();
  CheckAlignedFamily();
  CheckOperatorNew();
  CheckLibraryInternals();
  CheckErrno();
  if (g_failures != 0) {
    fprintf(stderr, "override_probe: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("override_probe: all checks passed\n");
  return 0;
}
