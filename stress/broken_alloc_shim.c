/* A deliberately broken allocator, preloaded by the stress suite's own test to prove that its
 * verification catches damage. It forwards to glibc's __libc_* functions but keeps a 16-byte
 * header in front of each block holding glibc's pointer and the size the caller asked for, so
 * realloc knows exactly how many bytes are the caller's. BRISK_BROKEN_ALLOC chooses the damage:
 *   realloc_short  realloc moves every block and copies one byte fewer than it should;
 *   calloc_dirty   calloc(1, n) does not zero: it fills the block with 0xA5. Only that form,
 *                  which the suite uses: the dynamic loader and libc call calloc(n, size) for
 *                  thread-local storage and would crash before the suite could check;
 *   (unset)        a correct allocator, so the shim itself can be checked.
 * Every entry point that hands out or takes back memory goes through the header, so blocks
 * never cross between the shim and glibc's own bookkeeping. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern void* __libc_malloc(size_t size);
extern void* __libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void* ptr);

enum { kHeader = 16 };
enum damage { DAMAGE_UNKNOWN = -1, DAMAGE_NONE, DAMAGE_REALLOC_SHORT, DAMAGE_CALLOC_DIRTY };

struct header {
  void* raw;   /* what glibc returned */
  size_t size; /* what the caller asked for */
};

static enum damage current_damage(void) {
  static volatile int cached = DAMAGE_UNKNOWN;
  if (cached == DAMAGE_UNKNOWN) {
    const char* mode = getenv("BRISK_BROKEN_ALLOC"); /* getenv does not allocate */
    int d = DAMAGE_NONE;
    if (mode != NULL && strcmp(mode, "realloc_short") == 0) d = DAMAGE_REALLOC_SHORT;
    if (mode != NULL && strcmp(mode, "calloc_dirty") == 0) d = DAMAGE_CALLOC_DIRTY;
    cached = d;
  }
  return (enum damage)cached;
}

static struct header* header_of(void* ptr) { return (struct header*)((char*)ptr - kHeader); }

static void* finish(void* raw, size_t offset, size_t size) {
  if (raw == NULL) return NULL;
  char* user = (char*)raw + offset;
  struct header* h = header_of(user);
  h->raw = raw;
  h->size = size;
  return user;
}

static void* aligned(size_t alignment, size_t size) {
  if (alignment < kHeader) alignment = kHeader;
  if (size > SIZE_MAX - alignment) {
    errno = ENOMEM;
    return NULL;
  }
  return finish(__libc_memalign(alignment, size + alignment), alignment, size);
}

void* malloc(size_t size) {
  if (size > SIZE_MAX - kHeader) {
    errno = ENOMEM;
    return NULL;
  }
  return finish(__libc_malloc(size + kHeader), kHeader, size);
}

void free(void* ptr) {
  if (ptr != NULL) __libc_free(header_of(ptr)->raw);
}

void* calloc(size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  void* p = malloc(total);
  if (p != NULL)
    memset(p, current_damage() == DAMAGE_CALLOC_DIRTY && count == 1 ? 0xA5 : 0, total);
  return p;
}

void* realloc(void* ptr, size_t size) {
  if (ptr == NULL) return malloc(size);
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  void* moved = malloc(size);
  if (moved == NULL) return NULL;
  size_t keep = header_of(ptr)->size < size ? header_of(ptr)->size : size;
  if (current_damage() == DAMAGE_REALLOC_SHORT && keep > 0) --keep;
  memcpy(moved, ptr, keep);
  free(ptr);
  return moved;
}

void* reallocarray(void* ptr, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(ptr, total);
}

void* memalign(size_t alignment, size_t size) { return aligned(alignment, size); }
void* aligned_alloc(size_t alignment, size_t size) { return aligned(alignment, size); }
void* valloc(size_t size) { return aligned(4096, size); }
void* pvalloc(size_t size) { return aligned(4096, (size + 4095) & ~(size_t)4095); }

int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = aligned(alignment, size);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

size_t malloc_usable_size(void* ptr) { return ptr == NULL ? 0 : header_of(ptr)->size; }
