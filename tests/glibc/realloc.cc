// Port of glibc's malloc/tst-realloc: realloc(NULL, n) is malloc (an impossible n fails with
// ENOMEM), growing and shrinking keep the contents, a failed realloc leaves the block intact,
// realloc(p, 0) frees p and returns NULL, and realloc(NULL, 0) returns a block (glibc).
#include <errno.h>
#include <stdlib.h>

#include "tests/glibc/port.h"

int main() {
  port::Start("tst-realloc", 20);
  errno = 0;
  void* p = realloc(nullptr, port::Opaque(SIZE_MAX));
  PORT_CHECK(p == nullptr && errno == ENOMEM, "realloc(NULL, SIZE_MAX) = %p, errno %d", p, errno);

  p = realloc(nullptr, port::Opaque(size_t{10}));
  PORT_CHECK(p != nullptr, "realloc(NULL, 10) failed");
  free(p);

  p = calloc(20, 1);
  PORT_CHECK(p != nullptr, "calloc(20, 1) failed");
  p = realloc(p, port::Opaque(size_t{200}));
  PORT_CHECK(p != nullptr && port::AllBytes(p, 20, 0), "realloc(p, 200) lost the 20 zero bytes");
  free(p);

  // glibc checks 100 -> 16; the larger steps cross brisk's small, medium and large blocks.
  const size_t sizes[][2] = {{100, 16}, {5000, 300}, {300 * 1024, 70 * 1024}, {5 << 20, 100}};
  for (const auto& s : sizes) {
    p = realloc(nullptr, port::Opaque(s[0]));
    PORT_CHECK(p != nullptr, "realloc(NULL, %zu) failed", s[0]);
    if (p == nullptr) continue;
    memset(p, 0xff, s[0]);
    void* q = realloc(p, port::Opaque(s[1]));
    PORT_CHECK(q != nullptr && port::AllBytes(q, s[1], 0xff), "realloc %zu -> %zu lost the contents", s[0], s[1]);
    if (q == nullptr) {
      free(p);
      continue;
    }
    errno = 0;
    void* r = realloc(q, port::Opaque(SIZE_MAX));
    PORT_CHECK(r == nullptr && errno == ENOMEM, "realloc(p, SIZE_MAX) = %p, errno %d", r, errno);
    PORT_CHECK(port::AllBytes(q, s[1], 0xff), "a failed realloc damaged the %zu-byte block", s[1]);
    r = realloc(q, port::Opaque(size_t{0}));
    PORT_CHECK(r == nullptr, "realloc(p, 0) = %p, not NULL", r);
  }

  p = realloc(nullptr, port::Opaque(size_t{0}));
  PORT_CHECK(p != nullptr, "realloc(NULL, 0) returned NULL");
  free(p);
  return port::Finish();
}
