// The foreign cache: small blocks of other heaps' spans that this thread freed, kept for this
// thread's own next allocations of their class instead of being sent to their owners.
//
// The idea is tcmalloc's thread cache, which holds whatever its thread freed, whoever allocated
// it. brisk's blocks otherwise go home to the heap that owns their span (remote_free.h), which
// on a ring of threads that each free what the previous one allocated (xmalloc-test) moves every
// block between cores twice: to the freer, which reads it, and back to the owner, which reads
// its link and writes it onto its span's free list. Kept here, a block the freer has just read
// is handed out again from the freer's cache.
//
// Invariants:
// - A cached block has been claimed by free_slow's exchange of its free key and keeps the key,
//   so a second free of it, by any thread, is reported as a double free.
// - It still counts as used in its span (the owner's `used`), so its span is never released,
//   purged or handed to another class while the block waits here. Taken out, it is live again
//   without touching the span.
// - No lock: the owner thread adds (free_slow) and takes (alloc_refill) with out_busy set and
//   the foreign_taken mark clear; another thread (the background pass for an idle heap,
//   brisk_trim) takes the whole cache in heap_take_outgoing, holding the heap's slow lock, with
//   the fence that guards the outgoing batches (remote_free.cc). The owner also sends the cache
//   home under its slow lock: on an overflow, at collect and at exit.
// - A class is cached only while the thread grows in it: it needed a new span of the class
//   (alloc_refill found no room in its own spans) and none of its own full spans of the class
//   has had a block freed back to it since (free_local_refilled). A thread whose own blocks come
//   back sends other threads' blocks home, so none of them circulates in its working set (each
//   such block's free and allocation take the slow paths): on larson-classic at full scale,
//   caching whenever the thread had refilled the class kept 8.6M of 15M frees circulating and
//   took 1.25x the time. Low-memory mode keeps a class from its first refill on instead
//   (BRISK_FOREIGN_CACHE_ALWAYS): less memory, more slow-path work. A thread that only frees
//   others' blocks (a consumer) caches nothing in either.
// - The cache holds at most BRISK_FOREIGN_CACHE_BYTES (a strategy lever); past it everything
//   goes home and no class is cached until the thread needs a new span of it again (in
//   low-memory mode, until its next refill of it).
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// By h's owner, in free_slow, h's slow lock not held: keeps b (claimed, in small span s, owned
// by another heap) for h's next allocation of its class. False: not kept, send it as usual.
bool foreign_cache_add(Heap* h, Span* s, Block* b);
// By h's owner, in alloc_refill of class c, h's slow lock not held: a cached block of class c,
// live again (free key cleared), or nullptr.
void* foreign_cache_take(Heap* h, unsigned c);
// Under h's slow lock, by h's owner thread: every cached block goes to its span's owner as a
// remote free of this thread (or back to the span, if h owns it now).
void foreign_cache_flush(Heap* h);
// By another thread holding h's slow lock, inside heap_take_outgoing's fence: every cached
// block is sent to its span's owner. Returns the bytes sent.
std::size_t foreign_cache_send(Heap* h);

}  // namespace brisk
