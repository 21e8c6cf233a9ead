// The allocators brisk-microbench measures, behind one table of function pointers, so every
// case runs against each of them in the same process and their ratio comes from one run.
#ifndef BRISK_BENCH_MICRO_ALLOC_API_H
#define BRISK_BENCH_MICRO_ALLOC_API_H

#include <cstddef>
#include <string>
#include <vector>

namespace brisk::bench {

struct AllocApi {
  std::string name;
  void* (*malloc)(std::size_t size);
  void (*free)(void* pointer);
  void* (*calloc)(std::size_t count, std::size_t size);
  void* (*realloc)(void* pointer, std::size_t size);
  void* (*aligned_alloc)(std::size_t alignment, std::size_t size);
};

// brisk (the brisk_* API, when built with it), mimalloc's mi_* API (when libmimalloc.so.2 is
// installed and can be loaded without taking over this process's malloc) and the process's own
// malloc. *notes gets one line per allocator left out.
std::vector<AllocApi> available_apis(std::vector<std::string>* notes);

// Checks that an API's blocks are usable, aligned and zeroed as promised. Returns an empty string
// or a description of the first problem.
std::string self_check(const AllocApi& api);

}  // namespace brisk::bench

#endif
