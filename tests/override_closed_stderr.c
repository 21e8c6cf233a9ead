/* A program that closes stderr before it exits, as coreutils' close_stdout does: debug mode's
 * leak report and BRISK_STATS's table, which run after the program's exit handlers, must still
 * reach the stderr the program started with (tests/closed_stderr.sh). It keeps one block of 100 bytes live to the end,
 * which BRISK_DEBUG_LEAKS=2 lists with every other live block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  char* kept = malloc(100);
  if (kept == NULL) return 2;
  memset(kept, 1, 100);
  fprintf(stderr, "closed_stderr: closing stderr\n");
  if (fclose(stderr) != 0) return 3;
  printf("%d\n", kept[99]);
  return 0;
}
