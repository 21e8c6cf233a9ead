/* Prints what brisk read from the environment, for tests/secure_env.sh: the kernel's AT_SECURE,
 * the strategy (BRISK_STRATEGY) and whether debug mode is on (BRISK_DEBUG). Linked with
 * libbrisk.a, so that a set-group-ID copy of it needs no library path the loader would ignore
 * in secure-execution mode. */
#include <brisk/brisk.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>

int main(void) {
  void* p = malloc(100);
  printf("secure=%lu strategy=%d debug=%d\n", getauxval(AT_SECURE), (int)brisk_get_strategy(), brisk_debug_active());
  free(p);
  return 0;
}
