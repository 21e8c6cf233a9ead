// Medium blocks: one block per span, a run of 64 KiB pages, grown and shrunk in place.
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// zero: calloc; nullptr: no memory. room: the bytes whose pages the block's span takes, at least
// size (0: size): pages past the block for a realloc to grow into in place, untouched until then.
void* alloc_medium(Heap* h, std::size_t size, bool zero, std::size_t room = 0);
// In-place resize of a medium block, by any thread that holds it. False if it must move.
bool medium_resize_in_place(Span* s, std::size_t new_size);

// The medium cache (medium.cc): spans of freed medium blocks a heap keeps for its next ones,
// at most kMediumCacheSlots of them and BRISK_MEDIUM_CACHE_BYTES in all (the oldest go first).
// With h's slow lock held by its owner: s, a medium span of h whose block the owner just freed,
// is kept or given back to its chunk.
void medium_freed(Heap* h, Span* s);
// With h's slow lock held: gives every cached span back to its chunk; returns their bytes.
std::size_t medium_cache_flush(Heap* h);

}  // namespace brisk
