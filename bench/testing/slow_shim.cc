// libbrisk_bench_slow_shim.so: a preloadable "allocator" for brisk-compare's tests. It forwards
// malloc, calloc, realloc and free to glibc (so the preload probe sees malloc defined here) and
// its constructor busy-waits BRISK_BENCH_SHIM_DELAY_MS milliseconds (default 200) of wall time,
// so a workload that itself runs for that long takes twice as long under it.
#include <chrono>
#include <cstddef>
#include <cstdlib>

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* pointer, std::size_t size);
void __libc_free(void* pointer);

__attribute__((visibility("default"))) void* malloc(std::size_t size) { return __libc_malloc(size); }
__attribute__((visibility("default"))) void* calloc(std::size_t count, std::size_t size) {
  return __libc_calloc(count, size);
}
__attribute__((visibility("default"))) void* realloc(void* pointer, std::size_t size) {
  return __libc_realloc(pointer, size);
}
__attribute__((visibility("default"))) void free(void* pointer) { __libc_free(pointer); }
}

namespace {

__attribute__((constructor)) void delay_start() {
  long milliseconds = 200;
  if (const char* text = std::getenv("BRISK_BENCH_SHIM_DELAY_MS")) milliseconds = std::strtol(text, nullptr, 10);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(milliseconds);
  while (std::chrono::steady_clock::now() < deadline) {
  }
}

}  // namespace
