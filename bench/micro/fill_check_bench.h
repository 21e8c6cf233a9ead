// The debug layer's freed-pattern check (debug/fill_check) against the loops it replaces, at the
// issue's sizes: 15, 39, 40, 41, 64 B, 4 KiB, 64 KiB.
//   check      find_fill_damage, the CPU-dispatched wide compare
//   loop8      a plain loop of 8-byte words, then 4/2/1-byte remainders
//   loop32     the seed's loop: four 8-byte words per iteration, then the 8-byte loop and remainders
//   memcmp     glibc's memcmp of the block against a buffer of the pattern
//   portable, sse2, avx2, avx512   each implementation of the check, called directly
#ifndef BRISK_BENCH_MICRO_FILL_CHECK_BENCH_H
#define BRISK_BENCH_MICRO_FILL_CHECK_BENCH_H

#include <cstdio>

namespace brisk::bench {

// Google Benchmark cases fill_check/LOOP/SIZE.
void register_fill_check_cases();

// The seed's method in one process: per size, 3 warm-up rounds and then `pairs` rounds; each
// round times every loop once over the same block, in an order that rotates each round; each
// loop's time is paired with the dispatched check's time of the same round. Prints, per size, the
// median of loop/check with its 10,000-resample 95% bootstrap interval (above 1: the check is
// faster). Returns 0.
int run_fill_check_pairs(int pairs, std::FILE* out);

}  // namespace brisk::bench

#endif
