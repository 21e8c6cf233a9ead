// Port of glibc's malloc/tst-reallocarray: n * m overflow fails with ENOMEM (both orders, and a
// product just past SIZE_MAX), reallocarray(NULL, ...) allocates, growing and shrinking keep the
// contents, and an overflowing resize leaves the block intact.
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-reallocarray", 20);
  const size_t max = SIZE_MAX;
  const size_t a = 65537, b = max / 65537 + 1;
  const size_t overflowing[][2] = {{max, 2}, {2, max}, {a, b}, {b, a}};
  for (const auto& f : overflowing) {
    errno = 0;
    void* p = reallocarray(nullptr, port::Opaque(f[0]), port::Opaque(f[1]));
    PORT_CHECK(p == nullptr && errno == ENOMEM, "reallocarray(NULL, %zu, %zu) = %p, errno %d", f[0], f[1], p, errno);
  }

  void* p = reallocarray(nullptr, port::Opaque(size_t{10}), port::Opaque(size_t{2}));
  PORT_CHECK(p != nullptr && malloc_usable_size(p) >= 20, "reallocarray(NULL, 10, 2) = %p", p);
  if (p == nullptr) return port::Finish();
  memset(p, 0xaf, 20);

  void* q = reallocarray(p, port::Opaque(size_t{20}), port::Opaque(size_t{2}));
  PORT_CHECK(q != nullptr, "reallocarray(p, 20, 2) failed");
  if (q != nullptr) p = q;
  PORT_CHECK(malloc_usable_size(p) >= 40 && port::AllBytes(p, 20, 0xaf), "growing lost the contents");

  q = reallocarray(p, port::Opaque(size_t{5}), port::Opaque(size_t{3}));
  PORT_CHECK(q != nullptr, "reallocarray(p, 5, 3) failed");
  if (q != nullptr) p = q;
  PORT_CHECK(malloc_usable_size(p) >= 15 && port::AllBytes(p, 15, 0xaf), "shrinking lost the contents");

  errno = 0;
  q = reallocarray(p, port::Opaque(size_t{2}), port::Opaque(max));
  PORT_CHECK(q == nullptr && errno == ENOMEM, "reallocarray(p, 2, SIZE_MAX) = %p, errno %d", q, errno);
  PORT_CHECK(port::AllBytes(p, 15, 0xaf), "an overflowing reallocarray damaged the block");
  free(p);
  return port::Finish();
}
