/* brisk-pair-loop SIZE [COUNT [HELD]]: COUNT (default 20 million) malloc+free pairs of SIZE
 * bytes through the process's malloc, printing nanoseconds per pair; HELD (default 0) blocks of
 * the size are allocated first and kept, which moves where in a span (or size-class run) the
 * pairs fall: brisk's one-page spans of 64 B hold 1,024, so 1,023 puts every pair at the
 * boundary (each malloc takes the last block, each free gives it back to a full span), and 0
 * empties the span at every free. Run it under LD_PRELOAD of each allocator to compare
 * single-thread fast paths on equal terms (no dlopen'ed function pointers, every call through
 * the PLT as in a real program). The README's "Single operations" table
 * is the median of five runs per size and allocator. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: brisk-pair-loop SIZE [COUNT [HELD]]\n");
    return 2;
  }
  size_t size = strtoull(argv[1], NULL, 10);
  long count = argc > 2 ? atol(argv[2]) : 20000000L;
  long held = argc > 3 ? atol(argv[3]) : 0;
  if (held > 0) {
    /* Reachable from a global to the end, so a leak report does not list them. */
    static void** volatile kept;
    kept = malloc(sizeof(void*) * (size_t)held);
    for (long i = 0; kept != NULL && i < held; i++)
      if ((kept[i] = malloc(size)) == NULL) kept = NULL;
    if (kept == NULL) {
      fprintf(stderr, "brisk-pair-loop: malloc failed\n");
      return 1;
    }
  }
  void* volatile sink;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < count; i++) {
    void* p = malloc(size);
    sink = p;
    free(p);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  (void)sink;
  printf("%.2f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)count);
  return 0;
}
