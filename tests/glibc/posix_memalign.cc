// Port of glibc's malloc/tst-posix_memalign: an impossible size returns ENOMEM and leaves the
// out-pointer alone, an invalid alignment (not a power of two, 0, or not a multiple of
// sizeof(void*)) returns EINVAL, a zero size succeeds, and the result honours the alignment.
// brisk's README adds what glibc does with errno: ENOMEM is left in it too, EINVAL is not.
#include <errno.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-posix_memalign", 20);
  const size_t page = static_cast<size_t>(getpagesize());

  void* p = nullptr;
  errno = 0;
  int rc = posix_memalign(&p, port::Opaque(sizeof(void*)), port::Opaque(SIZE_MAX));
  PORT_CHECK(rc == ENOMEM && p == nullptr, "posix_memalign(8, SIZE_MAX) = %d, p = %p", rc, p);
  PORT_CHECK(errno == ENOMEM, "posix_memalign(8, SIZE_MAX) left errno %d", errno);

  p = nullptr;
  rc = posix_memalign(&p, port::Opaque(page), port::Opaque(0 - page));
  PORT_CHECK(rc == ENOMEM && p == nullptr, "posix_memalign(page, -page) = %d, p = %p", rc, p);

  for (size_t alignment : {SIZE_MAX, size_t{0x300}, size_t{0}, size_t{4}}) {
    p = nullptr;
    errno = 0;
    rc = posix_memalign(&p, port::Opaque(alignment), port::Opaque(size_t{10}));
    PORT_CHECK(rc == EINVAL && p == nullptr && errno == 0, "posix_memalign(%#zx, 10) = %d, p = %p, errno %d",
               alignment, rc, p, errno);
  }

  p = nullptr;
  rc = posix_memalign(&p, port::Opaque(sizeof(void*)), port::Opaque(size_t{0}));
  PORT_CHECK(rc == 0 && p != nullptr, "posix_memalign(8, 0) = %d, p = %p", rc, p);
  free(p);

  for (size_t alignment = sizeof(void*); alignment <= 1 << 22; alignment <<= 1) {
    p = nullptr;
    rc = posix_memalign(&p, port::Opaque(alignment), port::Opaque(size_t{10}));
    PORT_CHECK(rc == 0 && p != nullptr && port::Aligned(p, alignment), "posix_memalign(%zu, 10) = %d, p = %p",
               alignment, rc, p);
    free(p);
  }
  return port::Finish();
}
