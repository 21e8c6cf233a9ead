// Port of glibc's malloc/tst-malloc-usable. glibc's test runs under MALLOC_CHECK_=3, where
// malloc_usable_size returns exactly the request; that mode is glibc-internal. What it checks
// of the interface: the usable size is at least the request and all of it may be written, and
// malloc_usable_size(NULL) is 0. Sizes cover brisk's small, medium and large blocks.
#include <malloc.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-malloc-usable", 20);
  const size_t sizes[] = {1, 7, 16, 24, 100, 1000, 4097, 65536, 65537, 300000, 2 << 20, (2 << 20) + 1, 9 << 20};
  void* blocks[sizeof sizes / sizeof sizes[0]];
  size_t usable[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    blocks[i] = malloc(port::Opaque(sizes[i]));
    PORT_CHECK(blocks[i] != nullptr, "malloc(%zu) failed", sizes[i]);
    if (blocks[i] == nullptr) return port::Finish();
    usable[i] = malloc_usable_size(blocks[i]);
    PORT_CHECK(usable[i] >= sizes[i], "malloc(%zu): usable size %zu", sizes[i], usable[i]);
    memset(blocks[i], static_cast<int>(i + 1), usable[i]);
  }
  // Writing every usable byte of each block left every other block as it was.
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    const auto* c = static_cast<const unsigned char*>(blocks[i]);
    for (size_t j = 0; j < usable[i]; ++j) {
      if (c[j] != i + 1) {
        PORT_CHECK(c[j] == i + 1, "malloc(%zu): byte %zu of its usable size was overwritten", sizes[i], j);
        break;
      }
    }
    free(blocks[i]);
  }
  PORT_CHECK(malloc_usable_size(nullptr) == 0, "malloc_usable_size(NULL) = %zu", malloc_usable_size(nullptr));
  return port::Finish();
}
