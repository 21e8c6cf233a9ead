// Span holes: the OS pages of a small span that hold only free blocks, given back to the OS by
// brisk_trim (the calling thread's spans and orphans) and by the background pass (orphans
// unchanged for a purge delay) while the span still holds a live block elsewhere.
//
// A span's free list lives in its free blocks (word 0 the link, word 1 the free key, core/
// free_key.h), so a page given back takes the list's links and keys with it. The blocks that
// touch a hole therefore leave the list (they stay free, and are not in `used`), and the span
// records the hole in Span::hole_pages. Their free keys are gone too: a second free of such a
// block would pass an owner's free_fast (its word 1 reads zero), and take one off `used` for a
// block never handed out. So a span with holes is never a heap's: brisk_trim gives the calling
// thread's to their class's central pool as orphans (threadcache/orphans.h), adoption refuses
// them, every free into one takes the orphan queue, whose drain reports a block in a hole as
// freed twice (span_block_in_hole), and the heap that takes it from the pool makes the holes'
// blocks free-listed again first (span_fill_holes, under the pool's lock), which faults their
// pages back in only then, when the class needs blocks. Other running threads' spans get no
// holes: their owners' fast paths use the free lists without a lock.
//
// glibc's malloc_trim gives back the pages inside its free chunks the same way (whole pages
// only, the chunk headers kept); jemalloc, tcmalloc and mimalloc give back only whole empty
// runs, spans or pages of their size classes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/span.h"

namespace brisk {

// With the right to rewrite s's free list (its owner under its slow lock, or the holder of its
// central pool's lock for an orphan): the OS pages wholly inside s's carved part whose every
// block is on the free list (or in a hole already) go back to the OS; their blocks leave the
// list, and the pages join s->hole_pages. A damaged free list is reported (a link outside the
// span's carved blocks, or a cycle). Returns the bytes given back.
std::size_t span_punch_holes(Span* s);
// Under s's central pool's lock, s an orphan with holes: every block touching a hole is pushed
// on the free list again (link and key written) and hole_pages cleared. A block whose key word
// lies in a hole and no longer reads zero was freed a second time, or written after it was
// freed, since its page went back: reported, naming the block.
void span_fill_holes(Span* s);
// Whether the block at address a (a block start of s's carved part) touches one of s's holes.
bool span_block_in_hole(const Span* s, std::uintptr_t a);

// Span tails: a small span claims whole 64 KiB pages, resident ones first, and is carved one OS
// page at a time, so the OS pages past its carved part may hold an earlier span's data that no
// block of s uses yet (BRISK_PURGE_SPAN_TAILS, threadcache/span_pages.cc).
// With the right to carve s (its owner under its slow lock, or the holder of its central pool's
// lock for an orphan): the OS pages past s's carved part, if any of them held data, go back to
// the OS (one madvise). Returns the bytes.
std::size_t span_drop_tail(Span* s);
// The OS pages of s from `from` (OS-page aligned, past its carved part) to its end were given
// back: its chunk's record of written OS pages and s->resident_pages follow.
void span_forget_tail(Span* s, std::uintptr_t from);

}  // namespace brisk
