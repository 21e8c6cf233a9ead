#include "bench/micro/alloc_api.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#ifdef BRISK_BENCH_HAVE_BRISK
#include <brisk/brisk.h>
#endif

namespace brisk::bench {
namespace {

std::string owner_of_malloc() {
  Dl_info info{};
  void* address = dlsym(RTLD_DEFAULT, "malloc");
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

// mimalloc's functions, found with dlsym. mi_malloc_aligned takes (size, alignment).
void* (*mi_malloc_aligned_fn)(std::size_t, std::size_t) = nullptr;
void* mi_aligned_adapter(std::size_t alignment, std::size_t size) { return mi_malloc_aligned_fn(size, alignment); }

void* system_aligned(std::size_t alignment, std::size_t size) {
  void* pointer = nullptr;
  return posix_memalign(&pointer, alignment < sizeof(void*) ? sizeof(void*) : alignment, size) == 0 ? pointer : nullptr;
}

bool load_mimalloc(AllocApi* api, std::string* note) {
  const std::string before = owner_of_malloc();
  // RTLD_LOCAL keeps mimalloc's own malloc/free definitions out of the global scope, so the
  // process (and the other columns' bookkeeping) keep using their own allocators.
  void* handle = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *note = "mimalloc left out: " + std::string(dlerror());
    return false;
  }
  if (owner_of_malloc() != before) {
    *note = "mimalloc left out: loading it replaced this process's malloc";
    return false;
  }
  api->name = "mimalloc";
  api->malloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(handle, "mi_malloc"));
  api->free = reinterpret_cast<void (*)(void*)>(dlsym(handle, "mi_free"));
  api->calloc = reinterpret_cast<void* (*)(std::size_t, std::size_t)>(dlsym(handle, "mi_calloc"));
  api->realloc = reinterpret_cast<void* (*)(void*, std::size_t)>(dlsym(handle, "mi_realloc"));
  mi_malloc_aligned_fn = reinterpret_cast<void* (*)(std::size_t, std::size_t)>(dlsym(handle, "mi_malloc_aligned"));
  api->aligned_alloc = mi_aligned_adapter;
  if (!api->malloc || !api->free || !api->calloc || !api->realloc || !mi_malloc_aligned_fn) {
    *note = "mimalloc left out: libmimalloc.so.2 lacks part of the mi_* API";
    return false;
  }
  return true;
}

}  // namespace

std::vector<AllocApi> available_apis(std::vector<std::string>* notes) {
  std::vector<AllocApi> apis;
#ifdef BRISK_BENCH_HAVE_BRISK
  apis.push_back({"brisk", brisk_malloc, brisk_free, brisk_calloc, brisk_realloc, brisk_aligned_alloc});
#else
  notes->push_back("brisk left out: built without brisk::core");
#endif
  AllocApi mimalloc{};
  std::string note;
  if (load_mimalloc(&mimalloc, &note)) {
    apis.push_back(mimalloc);
  } else {
    notes->push_back(note);
  }
  apis.push_back({"system", std::malloc, std::free, std::calloc, std::realloc, system_aligned});
  return apis;
}

std::string self_check(const AllocApi& api) {
  for (std::size_t size : {1u, 16u, 100u, 4096u, 70000u, 1u << 20}) {
    auto* block = static_cast<unsigned char*>(api.malloc(size));
    if (block == nullptr) return "malloc(" + std::to_string(size) + ") returned NULL";
    std::memset(block, 0xab, size);
    api.free(block);
    auto* zeroed = static_cast<unsigned char*>(api.calloc(1, size));
    if (zeroed == nullptr) return "calloc returned NULL";
    for (std::size_t i = 0; i < size; ++i) {
      if (zeroed[i] != 0) return "calloc(" + std::to_string(size) + ") returned a non-zero byte";
    }
    api.free(zeroed);
  }
  for (std::size_t alignment : {16u, 64u, 256u, 4096u, 65536u}) {
    void* block = api.aligned_alloc(alignment, 100);
    if (block == nullptr || reinterpret_cast<std::uintptr_t>(block) % alignment != 0)
      return "aligned_alloc(" + std::to_string(alignment) + ") is misaligned";
    api.free(block);
  }
  auto* grown = static_cast<unsigned char*>(api.malloc(16));
  for (int i = 0; i < 16; ++i) grown[i] = static_cast<unsigned char>(i);
  grown = static_cast<unsigned char*>(api.realloc(grown, 100000));
  for (int i = 0; i < 16; ++i) {
    if (grown[i] != i) return "realloc lost the block's contents";
  }
  api.free(grown);
  return "";
}

}  // namespace brisk::bench
