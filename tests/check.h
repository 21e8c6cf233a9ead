// CHECK for the override test programs (plain programs, no GoogleTest): a failed check prints
// one line naming the condition and counts itself in brisk_test::g_failures; the program exits
// 1 at the end if any failed.
#ifndef BRISK_TESTS_CHECK_H
#define BRISK_TESTS_CHECK_H

#include <stdio.h>

namespace brisk_test {
inline int g_failures = 0;
}  // namespace brisk_test

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      ++brisk_test::g_failures;                                       \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
    }                                                                 \
  } while (0)

#endif  // BRISK_TESTS_CHECK_H
