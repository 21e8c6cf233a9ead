// malloc_trim(0) with libbrisk.so preloaded: glibc's signature and contract (1 when memory was
// given back, 0 otherwise), served by brisk_trim, and the memory really leaves the process.
// Plain malloc/free only, built without brisk: the program does not know who serves it.
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "tests/test_util.h"

namespace {

using brisk_test::KeepOneBlockPerChunk;
using brisk_test::ResidentBytes;

int g_failures = 0;
#define CHECK(cond, ...)                        \
  do {                                          \
    if (!(cond)) {                              \
      fprintf(stderr, "FAIL: " __VA_ARGS__);    \
      fprintf(stderr, "\n");                    \
      ++g_failures;                             \
    }                                           \
  } while (0)

}  // namespace

int main() {
  alarm(60);  // a hang fails the test here, not at ctest's timeout
  Dl_info info{};
  void* sym = dlsym(RTLD_DEFAULT, "malloc_trim");
  CHECK(sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr &&
            strstr(info.dli_fname, "libbrisk.so") != nullptr,
        "malloc_trim resolves into %s, not libbrisk.so", info.dli_fname ? info.dli_fname : "?");

  // Blocks of 256 KiB filling several chunks; one live block is kept in each chunk and the rest
  // freed, so no chunk empties and only page purging can give the memory back.
  constexpr int kBlocks = 96;
  constexpr size_t kBlock = 256 * 1024;
  malloc_trim(0);
  size_t before = ResidentBytes();
  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    void* p = malloc(kBlock);
    if (p == nullptr) {
      fprintf(stderr, "FAIL: malloc(%zu) failed\n", kBlock);
      return 1;
    }
    memset(p, i, kBlock);
    blocks.push_back(p);
  }
  std::vector<size_t> kept = KeepOneBlockPerChunk(blocks, free);
  size_t freed = (blocks.size() - kept.size()) * kBlock;
  size_t dropped = ResidentBytes();
  CHECK(dropped - before >= freed / 2, "the freed blocks were not resident (before %zu, after %zu)", before, dropped);

  int released = malloc_trim(0);
  size_t trimmed = ResidentBytes();
  CHECK(released == 1, "malloc_trim(0) = %d after freeing %zu bytes", released, freed);
  CHECK(trimmed - before < freed / 4, "resident bytes: before %zu, after the frees %zu, after malloc_trim %zu",
        before, dropped, trimmed);
  printf("resident KiB: before %zu, after the frees %zu, after malloc_trim(0) %zu\n", before >> 10, dropped >> 10,
         trimmed >> 10);

  for (size_t i : kept) {
    const auto* p = static_cast<const unsigned char*>(blocks[i]);
    bool intact = true;
    for (size_t j = 0; intact && j < kBlock; ++j) intact = p[j] == static_cast<unsigned char>(i);
    CHECK(intact, "live block %zu lost its contents", i);
    free(blocks[i]);
  }
  if (g_failures != 0) {
    fprintf(stderr, "override_trim: %d check(s) failed\n", g_failures);
    return 1;
  }
  return 0;
}
