// Decay purging: returning to the OS the resident pages of a heap's free pages that stayed
// unused (purge.cc says how).
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// keep: the BRISK_PURGE_BYTES threshold that triggered the check; 0 purges every free page now.
// Returns the bytes decommitted or unmapped.
std::size_t heap_purge(Heap* h, std::size_t keep);

}  // namespace brisk
