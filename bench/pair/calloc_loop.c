/* brisk-calloc-loop SIZE [COUNT] [MODE]: COUNT (default 20000) callocs through the process's
 * calloc, 8 blocks live at a time, each checked to read zero where it is then written and freed
 * eight callocs later; prints nanoseconds per calloc. MODE says how a block is written:
 *   sparse  one byte every 64 KiB (a zeroed table the program touches in a few places);
 *   dense   every byte, sizes SIZE + 0..28 KiB (the default);
 *   fixed   every byte, every block SIZE.
 * Run it under LD_PRELOAD of each allocator (brisk-compare -- brisk-calloc-loop ...): a block
 * reused from a freed one must be zeroed, and how an allocator does that (a memset of the whole
 * block, or of only the pages that hold data) is what this measures. Exit status: 0, 1 if a
 * calloc returned NULL or non-zero bytes, 2 on wrong usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kLive = 8, kStride = 65536 };

static int usage(void) {
  fprintf(stderr, "usage: brisk-calloc-loop SIZE [COUNT] [sparse|dense|fixed]\n");
  return 2;
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) return usage();
  char* end = NULL;
  size_t size = strtoull(argv[1], &end, 10);
  if (*end != '\0' || size == 0 || size > ((size_t)1 << 30)) return usage();
  long count = argc > 2 ? strtol(argv[2], &end, 10) : 20000;
  if (argc > 2 && (*end != '\0' || count <= 0)) return usage();
  const char* mode = argc > 3 ? argv[3] : "dense";
  int sparse = strcmp(mode, "sparse") == 0, fixed = strcmp(mode, "fixed") == 0;
  if (!sparse && !fixed && strcmp(mode, "dense") != 0) return usage();
  unsigned char* live[kLive] = {0};
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < count; i++) {
    size_t n = fixed ? size : size + (size_t)(i % kLive) * 4096;
    unsigned char* p = calloc(1, n);
    if (p == NULL) {
      fprintf(stderr, "brisk-calloc-loop: calloc(1, %zu) returned NULL\n", n);
      return 1;
    }
    /* The bytes about to be written read zero first (only those: reading others would fault
     * in pages the program never uses). */
    for (size_t o = 0; o < n; o += kStride)
      if (p[o] != 0) {
        fprintf(stderr, "brisk-calloc-loop: calloc(1, %zu) = %p has %#x at offset %zu\n", n, (void*)p, p[o], o);
        return 1;
      }
    if (p[n - 1] != 0) {
      fprintf(stderr, "brisk-calloc-loop: calloc(1, %zu) = %p has %#x at its last byte\n", n, (void*)p, p[n - 1]);
      return 1;
    }
    if (sparse) {
      for (size_t o = 0; o < n; o += kStride) p[o] = 1;
      p[n - 1] = 1;
    } else {
      memset(p, 1, n);
    }
    free(live[i % kLive]);
    live[i % kLive] = p;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  for (int i = 0; i < kLive; i++) free(live[i]);
  printf("%.2f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)count);
  return 0;
}
