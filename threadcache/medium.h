// Medium blocks: one block per span, a run of 64 KiB pages, grown and shrunk in place.
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

void* alloc_medium(Heap* h, std::size_t size, bool zero);  // zero: calloc; nullptr: no memory
// In-place resize of a medium block, by any thread that holds it. False if it must move.
bool medium_resize_in_place(Span* s, std::size_t new_size);

}  // namespace brisk
