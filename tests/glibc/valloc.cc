// Port of glibc's malloc/tst-valloc: impossible sizes (including -pagesize, which overflows
// when rounded) fail with ENOMEM, a zero size succeeds, and the result is page-aligned.
#include <errno.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-valloc", 20);
  const size_t page = static_cast<size_t>(getpagesize());
  for (size_t size : {SIZE_MAX, 0 - page}) {
    errno = 0;
    void* p = valloc(port::Opaque(size));
    PORT_CHECK(p == nullptr && errno == ENOMEM, "valloc(%#zx) = %p, errno %d", size, p, errno);
    free(p);
  }
  void* p = valloc(port::Opaque(size_t{0}));
  PORT_CHECK(p != nullptr, "valloc(0) failed");
  free(p);
  for (size_t size : {size_t{32}, page, 3 * page + 5, size_t{1} << 20, size_t{3} << 20}) {
    p = valloc(port::Opaque(size));
    PORT_CHECK(p != nullptr && port::Aligned(p, page), "valloc(%zu) = %p, not page-aligned", size, p);
    if (p != nullptr) memset(p, 0x22, size);
    free(p);
  }
  return port::Finish();
}
