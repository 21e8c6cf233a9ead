// Port of glibc's malloc/tst-malloc-too-large: sizes no machine can serve (close to SIZE_MAX,
// just past PTRDIFF_MAX, and from 2^50 up in steps of 2^50) fail with ENOMEM from malloc,
// realloc (the old block intact), calloc and reallocarray split into factors, memalign,
// posix_memalign (the out-pointer untouched) and aligned_alloc at every power-of-two alignment,
// valloc and pvalloc. Each is preceded by a small malloc/free, because padding a huge size
// once overflowed into returning the block just freed (glibc bugs 22375 and 22343).
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "tests/glibc/port.h"

namespace {

void SmallRoundTrip() {
  void* volatile p = malloc(16);
  PORT_CHECK(p != nullptr, "malloc(16) failed");
  free(p);
  errno = 0;
}

#define EXPECT_ENOMEM(call, size)                                                                       \
  do {                                                                                                  \
    SmallRoundTrip();                                                                                   \
    void* r_ = (call);                                                                                  \
    PORT_CHECK(r_ == nullptr && errno == ENOMEM, "%s with size %#zx = %p, errno %d", #call, size, r_, errno); \
  } while (0)

void LargeAllocations(size_t size) {
  EXPECT_ENOMEM(malloc(port::Opaque(size)), size);
  void* old = malloc(16);
  PORT_CHECK(old != nullptr, "malloc(16) failed");
  memset(old, 0x66, 16);
  EXPECT_ENOMEM(realloc(old, port::Opaque(size)), size);
  for (size_t nmemb = 1; nmemb <= 8 && size % nmemb == 0; nmemb *= 2) {
    EXPECT_ENOMEM(calloc(port::Opaque(nmemb), port::Opaque(size / nmemb)), size);
    EXPECT_ENOMEM(calloc(port::Opaque(size / nmemb), port::Opaque(nmemb)), size);
    EXPECT_ENOMEM(reallocarray(old, port::Opaque(nmemb), port::Opaque(size / nmemb)), size);
    EXPECT_ENOMEM(reallocarray(old, port::Opaque(size / nmemb), port::Opaque(nmemb)), size);
  }
  const auto* c = static_cast<const unsigned char*>(old);
  for (int i = 0; i < 16; ++i) PORT_CHECK(c[i] == 0x66, "a failed realloc of size %#zx damaged the block", size);
  free(old);
}

void LargeAlignedAllocations(size_t size) {
  void* p = nullptr;
  for (size_t align = 1; align != 0; align <<= 1) {
    EXPECT_ENOMEM(memalign(port::Opaque(align), port::Opaque(size)), size);
    if (align % sizeof(void*) == 0) {
      SmallRoundTrip();
      int rc = posix_memalign(&p, port::Opaque(align), port::Opaque(size));
      PORT_CHECK(rc == ENOMEM && p == nullptr, "posix_memalign(%#zx, %#zx) = %d, p = %p", align, size, rc, p);
    }
    if (size % align == 0) EXPECT_ENOMEM(aligned_alloc(port::Opaque(align), port::Opaque(size)), size);
  }
  EXPECT_ENOMEM(valloc(port::Opaque(size)), size);
  EXPECT_ENOMEM(pvalloc(port::Opaque(size)), size);
}

void Both(size_t size) {
  LargeAllocations(size);
  LargeAlignedAllocations(size);
}

}  // namespace

int main() {
  port::Start("tst-malloc-too-large", 60);
  // No 64-bit machine this runs on has more than 50 address bits; make that true here too.
  const size_t fifty_bits = (size_t{1} << 50) - 1;
  struct rlimit limit = {fifty_bits, fifty_bits};
  setrlimit(RLIMIT_AS, &limit);

  // glibc walks every value of each range (about 10 million calls, over a minute under glibc
  // here); this takes every value within 256 of each end, where padding for bookkeeping or
  // alignment overflows, and every 61st in between, a step coprime with every power of two.
  const size_t fourteen_bits = (size_t{1} << 14) - 1;
  auto next = [&](size_t i) { return i < 256 || i > fourteen_bits - 256 ? i + 1 : i + 61; };
  for (size_t i = 0; i <= fourteen_bits; i = next(i)) Both(SIZE_MAX - i);
  for (size_t i = 1; i <= fourteen_bits; i = next(i)) Both(size_t{PTRDIFF_MAX} + i);
  for (size_t i = 0; i < fourteen_bits; i = next(i)) {
    size_t msbs = fourteen_bits - i;
    Both((msbs << 50) | fifty_bits);
    Both(msbs << 50);
  }
  return port::Finish();
}
