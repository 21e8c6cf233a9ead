/* brisk-pair-loop SIZE [COUNT]: COUNT (default 20 million) malloc+free pairs of SIZE bytes
 * through the process's malloc, printing nanoseconds per pair. Run it under LD_PRELOAD of each
 * allocator to compare single-thread fast paths on equal terms (no dlopen'ed function pointers,
 * every call through the PLT as in a real program). The README's "Single operations" table
 * is the median of five runs per size and allocator. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: brisk-pair-loop SIZE [COUNT]\n");
    return 2;
  }
  size_t size = strtoull(argv[1], NULL, 10);
  long count = argc > 2 ? atol(argv[2]) : 20000000L;
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
