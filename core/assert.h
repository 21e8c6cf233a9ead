// BRISK_ASSERT(condition): an invariant the code relies on, stated where it is relied on.
// Checked in a build configured with -DBRISK_CHECKED=ON (the test command's ASan and TSan builds
// are), where a violation prints "brisk: assertion failed: <condition> at <file>:<line>" and
// aborts; compiled out otherwise, without evaluating the condition, so release fast paths do
// not pay for it.
#pragma once

#include "core/hints.h"

#ifndef BRISK_CHECKED
#define BRISK_CHECKED 0
#endif

namespace brisk {
[[noreturn]] BRISK_COLD void assert_failed(const char* condition, const char* file, int line);
}  // namespace brisk

#if BRISK_CHECKED
#define BRISK_ASSERT(condition)                                                        \
  do {                                                                                 \
    if (BRISK_UNLIKELY(!(condition))) ::brisk::assert_failed(#condition, __FILE__, __LINE__); \
  } while (0)
#else
#define BRISK_ASSERT(condition) \
  do {                          \
    if (false) (void)(condition); \
  } while (0)
#endif
