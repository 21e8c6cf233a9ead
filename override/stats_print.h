// The statistics printers (stats_print.cc): brisk_print_stats is in brisk.h; malloc_info's XML
// (glibc's schema: free blocks by size class, totals, and the mapped space) is here.
#pragma once

#include <stdio.h>

namespace brisk {

// Writes malloc_info's XML to out without calling malloc.
void print_malloc_info(FILE* out);

}  // namespace brisk
