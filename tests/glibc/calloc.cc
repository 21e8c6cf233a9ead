// Port of glibc's malloc/tst-calloc: many live calloc blocks of fixed small sizes, then of
// random n * m sizes, each entirely zero although the blocks freed before them were dirtied;
// calloc with a zero count or size and a huge other factor does not crash.
#include <limits.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

namespace {

constexpr int kBlocks = 50000;
char* g_blocks[kBlocks];
unsigned g_seed = 1;

unsigned Random() {
  g_seed = g_seed * 1103515245u + 12345u;
  return g_seed >> 8;
}

// Every block must read zero; it is then dirtied so the next round reuses dirty memory.
void Round(size_t fixed_size) {
  int live = 0;
  for (; live < kBlocks; ++live) {
    size_t n = fixed_size != 0 ? 1 : 1 + Random() % 10;
    size_t elem = fixed_size != 0 ? fixed_size : 1 + Random() % 100;
    char* p = static_cast<char*>(calloc(n, elem));
    PORT_CHECK(p != nullptr, "calloc(%zu, %zu) failed", n, elem);
    if (p == nullptr) break;
    g_blocks[live] = p;
    for (size_t j = 0; j < n * elem; ++j) {
      if (p[j] != 0) {
        PORT_CHECK(p[j] == 0, "calloc(%zu, %zu): byte %zu of block %d not cleared", n, elem, j, live);
        break;
      }
    }
    memset(p, 0xff, n * elem);
  }
  while (live-- > 0) free(g_blocks[live]);
}

}  // namespace

int main() {
  port::Start("tst-calloc", 30);
  for (size_t size : {15, 5, 17, 6, 31, 96}) Round(size);
  Round(0);
  // Zero-sized results are implementation-defined: these must only not crash.
  free(calloc(port::Opaque(size_t{0}), port::Opaque(size_t{0})));
  free(calloc(port::Opaque(size_t{0}), port::Opaque(size_t{UINT_MAX})));
  free(calloc(port::Opaque(size_t{UINT_MAX}), port::Opaque(size_t{0})));
  free(calloc(port::Opaque(size_t{0}), port::Opaque(SIZE_MAX)));
  free(calloc(port::Opaque(SIZE_MAX), port::Opaque(size_t{0})));
  return port::Finish();
}
