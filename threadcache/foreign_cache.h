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

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "threadcache/heap.h"
#include "threadcache/remote_free.h"

namespace brisk {

// The owner's side of heap_take_outgoing's fence, read with out_busy set: a taker whose mark
// the owner does not see yet will see out_busy and leave the cache alone; one whose mark it
// sees owns the cache until it clears the mark (a release, which this acquire pairs with).
inline bool foreign_cache_taken(Heap* h) {
  return std::atomic_ref<std::uint8_t>(h->foreign_taken).load(std::memory_order_acquire) != 0;
}

// Counted as a slow path: a thread served from its cache may take no lock for a long time, and
// the background pass must not take it for idle.
inline void foreign_cache_note_activity(Heap* h) {
  h->slow_entries.store(h->slow_entries.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// With out_busy set and the cache not taken: b (claimed, of class c, size bytes, link_mask its
// free code's) joins the cache.
BRISK_ALWAYS_INLINE void foreign_cache_push(Heap* h, unsigned c, Block* b, std::uintptr_t link_mask,
                                            std::size_t size) {
  set_link(b, h->foreign[c], link_mask);
  h->foreign[c] = b;
  store_shared(h->foreign_bytes, h->foreign_bytes + size);
  foreign_cache_note_activity(h);
}

// By h's owner, in free_release_slow, h's slow lock not held: keeps b (claimed, in small span
// s, owned by another heap) for h's next allocation of its class. False: not kept, send it as
// usual.
bool foreign_cache_add(Heap* h, Span* s, Block* b);

// By h's owner (attached), in free_slow's remote free (heap.cc, free_remote_small), h's slow
// lock not held: keeps b, a block of class c and `size` bytes of a small span another live heap
// owns, whose free code is `code`, if the cache is not being taken and has room, claiming it by
// the exchange of its free key. False, with nothing changed, when it is not kept: the cache is
// taken or full (free_release_slow's foreign_cache_add then sends the whole cache home), or b is
// free already (free_release_slow's exchange finds the key that this one found, and reports).
BRISK_ALWAYS_INLINE bool foreign_cache_keep(Heap* h, unsigned c, Block* b, FreeCode code, std::size_t size) {
  out_busy_begin(h);
  // The byte count only inside out_busy, where a taker does not write it.
  if (BRISK_UNLIKELY(foreign_cache_taken(h)) || BRISK_UNLIKELY(h->foreign_bytes + size > h->foreign_limit) ||
      BRISK_UNLIKELY(std::atomic_ref<std::uintptr_t>(b->key).exchange(code.key, std::memory_order_relaxed) == code.key)) {
    out_busy_end(h);
    return false;
  }
  foreign_cache_push(h, c, b, code.link_mask, size);
  out_busy_end(h);
  return true;
}

// By h's owner, in alloc_refill of class c, h's slow lock not held: a cached block of class c,
// live again (free key cleared), or nullptr.
BRISK_ALWAYS_INLINE void* foreign_cache_take(Heap* h, unsigned c) {
  out_busy_begin(h);
  Block* b = foreign_cache_taken(h) ? nullptr : h->foreign[c];  // the mark first: a taker may own the cache
  if (b == nullptr) {
    out_busy_end(h);
    return nullptr;
  }
  h->foreign[c] = chain_next(b);
  store_shared(h->foreign_bytes, h->foreign_bytes - kClasses[c].size);
  foreign_cache_note_activity(h);
  out_busy_end(h);
  b->key = 0;  // a live block never carries the free key
  return b;
}

// Under h's slow lock, by h's owner thread: every cached block goes to its span's owner as a
// remote free of this thread (or back to the span, if h owns it now).
void foreign_cache_flush(Heap* h);
// By another thread holding h's slow lock, inside heap_take_outgoing's fence: every cached
// block is sent to its span's owner. Returns the bytes sent.
std::size_t foreign_cache_send(Heap* h);

}  // namespace brisk
