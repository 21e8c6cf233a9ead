// brisk-preload-probe: prints, on one line, which loaded object defines `malloc` and which defines
// `operator new(size_t)` in this process. brisk-compare runs it under each LD_PRELOAD to check
// that the preload really replaced the allocator (ld.so only prints a warning when it fails).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace {

const char* owner_of(void* address) {
  if (address == nullptr) return "none";
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

}  // namespace

int main() {
  // Use operator new so that libstdc++ (or the preload) is asked for it as in any C++ workload.
  int* volatile touch = new int(1);
  delete touch;
  // malloc as this program's calls bind it, with its symbol version: glibc's
  // libc_malloc_debug.so defines only malloc@GLIBC_2.2.5, which a versionless dlsym never finds.
  void* (*const bound_malloc)(std::size_t) = &std::malloc;
  std::printf("malloc=%s operator_new=%s\n", owner_of(reinterpret_cast<void*>(bound_malloc)),
              owner_of(dlsym(RTLD_DEFAULT, "_Znwm")));
  return 0;
}
