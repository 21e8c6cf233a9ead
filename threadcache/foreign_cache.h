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
// - Only under the heap's slow lock: the owner thread adds (free_slow) and takes (alloc_refill);
//   another thread (the background pass for an idle heap, brisk_trim) sends the cache's blocks to
//   their owners. The owner thread also sends them on an overflow, at collect and at exit.
// - A class is cached only while the thread allocates it (a refill of the class since its last
//   overflow), and the cache holds at most BRISK_FOREIGN_CACHE_BYTES (a strategy lever): a
//   thread that only frees others' blocks (a consumer) caches nothing, and what a busy thread
//   holds here is bounded.
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// By h's owner, in free_slow, h's slow lock not held: keeps b (claimed, in small span s, owned
// by another heap) for h's next allocation of its class. False: not kept, send it as usual.
bool foreign_cache_add(Heap* h, Span* s, Block* b);
// By h's owner under h's slow lock, in alloc_refill of class c: a cached block of class c, live
// again (free key cleared), or nullptr.
void* foreign_cache_take(Heap* h, unsigned c);
// Under h's slow lock, by h's owner thread: every cached block goes to its span's owner as a
// remote free of this thread (or back to the span, if h owns it now).
void foreign_cache_flush(Heap* h);
// Under h's slow lock, by another thread: every cached block is sent to its span's owner.
// Returns the bytes sent.
std::size_t foreign_cache_send(Heap* h);

}  // namespace brisk
