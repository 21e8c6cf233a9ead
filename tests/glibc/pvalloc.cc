// Port of glibc's malloc/tst-pvalloc: impossible sizes (including -pagesize, which overflows
// when rounded up to a page) fail with ENOMEM, a zero size succeeds, and the result is
// page-aligned with its whole last page usable.
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-pvalloc", 20);
  const size_t page = static_cast<size_t>(getpagesize());
  for (size_t size : {SIZE_MAX, 0 - page}) {
    errno = 0;
    void* p = pvalloc(port::Opaque(size));
    PORT_CHECK(p == nullptr && errno == ENOMEM, "pvalloc(%#zx) = %p, errno %d", size, p, errno);
    free(p);
  }
  void* p = pvalloc(port::Opaque(size_t{0}));
  PORT_CHECK(p != nullptr, "pvalloc(0) failed");
  free(p);
  for (size_t size : {size_t{32}, page, 3 * page + 5, size_t{1} << 20}) {
    p = pvalloc(port::Opaque(size));
    size_t rounded = (size + page - 1) & ~(page - 1);
    PORT_CHECK(p != nullptr && port::Aligned(p, page), "pvalloc(%zu) = %p, not page-aligned", size, p);
    if (p != nullptr) {
      PORT_CHECK(malloc_usable_size(p) >= rounded, "pvalloc(%zu): usable %zu < %zu", size, malloc_usable_size(p),
                 rounded);
      memset(p, 0x33, rounded);
    }
    free(p);
  }
  return port::Finish();
}
