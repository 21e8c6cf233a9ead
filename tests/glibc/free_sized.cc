// Port of glibc's malloc/tst-free-sized and tst-free-aligned-sized (glibc 2.43): free_sized and
// free_aligned_sized accept NULL and free a block of the size (and alignment) it was allocated
// with. Skipped (exit 77) where the C library has no free_sized, as glibc before 2.43.
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-free-sized", 20);
  using FreeSized = void (*)(void*, size_t);
  using FreeAlignedSized = void (*)(void*, size_t, size_t);
  auto free_sized_fn = reinterpret_cast<FreeSized>(dlsym(RTLD_DEFAULT, "free_sized"));
  auto free_aligned_sized_fn = reinterpret_cast<FreeAlignedSized>(dlsym(RTLD_DEFAULT, "free_aligned_sized"));
  if (free_sized_fn == nullptr || free_aligned_sized_fn == nullptr) {
    printf("tst-free-sized: skipped: free_sized is not in this C library\n");
    return 77;
  }
  free_sized_fn(nullptr, 0);
  free_aligned_sized_fn(nullptr, 64, 0);
  // Reused sizes: a block freed with the wrong bookkeeping would show up as damage or a crash.
  for (int round = 0; round < 3; ++round) {
    for (size_t size : {size_t{1}, size_t{128}, size_t{5000}, size_t{200000}, size_t{3} << 20}) {
      void* p = malloc(size);
      PORT_CHECK(p != nullptr, "malloc(%zu) failed", size);
      memset(p, 0x44, size);
      free_sized_fn(p, size);
      for (size_t alignment : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
        size_t rounded = (size + alignment - 1) & ~(alignment - 1);
        void* q = aligned_alloc(alignment, rounded);
        PORT_CHECK(q != nullptr && port::Aligned(q, alignment), "aligned_alloc(%zu, %zu) = %p", alignment, rounded, q);
        if (q != nullptr) memset(q, 0x55, rounded);
        free_aligned_sized_fn(q, alignment, rounded);
      }
    }
  }
  return port::Finish();
}
