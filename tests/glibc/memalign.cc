// Port of glibc's malloc/tst-memalign: impossible sizes fail with ENOMEM (including sizes that
// overflow once padded for the alignment), an impossible alignment fails with EINVAL, a zero
// size succeeds, and the result honours the alignment.
#include <errno.h>
#include <malloc.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-memalign", 20);
  const size_t page = static_cast<size_t>(getpagesize());

  errno = 0;
  void* p = memalign(port::Opaque(sizeof(void*)), port::Opaque(SIZE_MAX));
  PORT_CHECK(p == nullptr && errno == ENOMEM, "memalign(8, SIZE_MAX) = %p, errno %d", p, errno);
  free(p);

  errno = 0;
  p = memalign(port::Opaque(page), port::Opaque(0 - page));
  PORT_CHECK(p == nullptr && errno == ENOMEM, "memalign(page, -page) = %p, errno %d", p, errno);
  free(p);

  errno = 0;
  p = memalign(port::Opaque(SIZE_MAX), port::Opaque(page));
  PORT_CHECK(p == nullptr && errno == EINVAL, "memalign(SIZE_MAX, page) = %p, errno %d", p, errno);
  free(p);

  p = memalign(port::Opaque(sizeof(void*)), port::Opaque(size_t{0}));
  PORT_CHECK(p != nullptr, "memalign(8, 0) failed");
  free(p);

  for (size_t alignment = 16; alignment <= 1 << 22; alignment <<= 1) {
    p = memalign(port::Opaque(alignment), port::Opaque(size_t{10}));
    PORT_CHECK(p != nullptr && port::Aligned(p, alignment), "memalign(%zu, 10) = %p", alignment, p);
    if (p != nullptr) memset(p, 0x5a, 10);
    free(p);
  }
  return port::Finish();
}
