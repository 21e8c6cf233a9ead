// Port of glibc's malloc/tst-aligned-alloc: power-of-two alignments (1 included) succeed,
// alignments that are not a power of two, 0, and SIZE_MAX / 2 + 1 fail. glibc checks the
// alignment since 2.38; before, it rounded 65 up and took 0 as 1, so the control skips those.
#include <errno.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-aligned-alloc", 20);
  for (size_t alignment = 1; alignment <= 1 << 22; alignment <<= 1) {
    void* p = aligned_alloc(port::Opaque(alignment), port::Opaque(size_t{64}));
    PORT_CHECK(p != nullptr && port::Aligned(p, alignment), "aligned_alloc(%zu, 64) = %p", alignment, p);
    if (p != nullptr) memset(p, 0x11, 64);
    free(p);
  }
  for (size_t alignment : {size_t{65}, size_t{0}, SIZE_MAX / 2 + 1}) {
    if (alignment != SIZE_MAX / 2 + 1 && port::GlibcBefore(2, 38)) continue;
    errno = 0;
    void* p = aligned_alloc(port::Opaque(alignment), port::Opaque(size_t{64}));
    PORT_CHECK(p == nullptr, "aligned_alloc(%#zx, 64) = %p, not NULL", alignment, p);
    free(p);
  }
  return port::Finish();
}
