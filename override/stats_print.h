// The statistics printers (stats_print.cc): brisk_print_stats is in brisk.h; malloc_info's XML
// (glibc's schema: free blocks by size class, totals, and the mapped space) is here.
#pragma once

#include <stdio.h>

namespace brisk {

// brisk_print_stats to descriptor 2 without stdio, for BRISK_STATS at exit: through
// platform::write_stderr, so it reaches the stderr the program started with after the program
// has closed stdio's stderr (when keep_stderr ran at load).
void print_stats_to_stderr(int json);

// Writes malloc_info's XML to out without calling malloc.
void print_malloc_info(FILE* out);

}  // namespace brisk
