// Shared by the ports of glibc's malloc tests (tests/glibc/): a failure count, a watchdog, and a
// check that the allocator serving malloc is the one the test was registered for. Each port is
// registered twice (cmake/BriskTesting.cmake, brisk_add_glibc_port): with LD_PRELOAD=libbrisk.so
// and PORT_ALLOCATOR=brisk, and without it and PORT_ALLOCATOR=glibc as the control that shows
// what the test expects is glibc's behaviour. Written from what each glibc test checks.
#ifndef BRISK_TESTS_GLIBC_PORT_H
#define BRISK_TESTS_GLIBC_PORT_H

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <initializer_list>

namespace port {

inline int g_failures = 0;
inline const char* g_name = "";

#define PORT_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      ++port::g_failures;                                                          \
      fprintf(stderr, "%s: FAIL %s:%d: %s: ", port::g_name, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                \
      fputc('\n', stderr);                                                         \
    }                                                                              \
  } while (0)

// Keeps the compiler from folding an argument it could see is impossible.
template <class T>
T Opaque(T v) {
  volatile T x = v;
  return x;
}

inline bool Aligned(const void* p, size_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) & (alignment - 1)) == 0;
}

inline bool AllBytes(const void* p, size_t n, unsigned char value) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (c[i] != value) return false;
  return true;
}

// Where malloc comes from: the file name of the object that defines it.
inline const char* MallocProvider() {
  Dl_info info{};
  void* sym = dlsym(RTLD_DEFAULT, "malloc");
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// Starts the watchdog (a hang is a failure, reported by SIGALRM) and checks that malloc is
// served by the allocator named in PORT_ALLOCATOR (brisk or glibc).
inline void Start(const char* name, unsigned watchdog_seconds) {
  g_name = name;
  alarm(watchdog_seconds);
  const char* want = getenv("PORT_ALLOCATOR");
  const char* provider = MallocProvider();
  if (want == nullptr) {
    fprintf(stderr, "%s: PORT_ALLOCATOR is not set (brisk or glibc)\n", name);
    exit(1);
  }
  bool brisk = strstr(provider, "libbrisk") != nullptr;
  if (brisk != (strcmp(want, "brisk") == 0)) {
    fprintf(stderr, "%s: malloc is served by %s, expected %s\n", name, provider, want);
    exit(1);
  }
}

// True when glibc serves malloc in this run and is older than major.minor: behaviours that
// glibc adopted later (aligned_alloc's C17 alignment check, 2.38) are not expected of it.
inline bool GlibcBefore(int major, int minor) {
  const char* want = getenv("PORT_ALLOCATOR");
  if (want == nullptr || strcmp(want, "glibc") != 0) return false;
  int have_major = 0, have_minor = 0;
  if (sscanf(gnu_get_libc_version(), "%d.%d", &have_major, &have_minor) != 2) return false;
  return have_major < major || (have_major == major && have_minor < minor);
}

inline int Finish() {
  if (g_failures != 0) {
    fprintf(stderr, "%s: %d check(s) failed under %s\n", g_name, g_failures, getenv("PORT_ALLOCATOR"));
    return 1;
  }
  printf("%s: passed under %s\n", g_name, getenv("PORT_ALLOCATOR"));
  return 0;
}

}  // namespace port

#endif  // BRISK_TESTS_GLIBC_PORT_H
