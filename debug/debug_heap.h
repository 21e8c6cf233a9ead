// Debug heaps: one per thread that makes debug blocks, paired with its thread heap. Why they
// are heaps of their own and how they outlive their thread: threadcache/debug_switch.h. This
// file makes them, keeps every one in a registry that brisk_check_heap, the leak report and
// the fork handlers walk, keeps each one's list of live blocks (with the ring of blocks its
// owner just made), and gives an underlying block back to the debug heap that owns it.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/lock.h"
#include "debug/block_layout.h"
#include "debug/quarantine.h"
#include "debug/stack_trace.h"
#include "threadcache/heap.h"

namespace brisk::debug {

struct DebugHeap : Heap {
  DebugHeap() : Heap(&g_empty_span) { is_debug = true; }

  // The live debug blocks this heap made (small, medium and large), newest first, and the
  // state of every block it made, under live_lock: the owner takes it at each allocation, any
  // thread at a free, realloc or check of one of its blocks, so it is uncontended unless
  // another thread frees or checks this thread's blocks at that moment.
  SpinLock live_lock;
  Header* live = nullptr;
  // Blocks the owner made since live_lock was last taken, oldest first, not yet on the live
  // list: the owner adds each without a lock (add_made), and whoever takes live_lock next
  // (LiveLock) links them first, so under the lock the list holds every live block. An owner
  // that allocates and frees its blocks takes the lock once per pair, not twice (the lock's
  // exchange was 60% of debug allocate's samples on sh6bench). A single-producer ring: slots
  // written by the owner, published by made_tail's release store; consumed under live_lock,
  // handed back by made_head's. A block can change state only under the lock, so only after
  // it is linked: a pointer in the ring always names a live block.
  static constexpr unsigned kMadeBatch = 32;
  Header* made[kMadeBatch];
  std::atomic<std::uint32_t> made_tail{0};  // stored by the owner only
  std::atomic<std::uint32_t> made_head{0};  // stored under live_lock only
  std::uint64_t sequence = 0;          // blocks made so far (the owner's, like the spans)
  // Freed blocks of this heap on their way to the quarantine, oldest first, under live_lock:
  // a free of a small block fills it and adds it here under the one lock it takes anyway, and
  // the quarantine's shard lock is taken once per kFreedBatch of them (block.cc's release).
  // They are quarantined blocks already: brisk_check_heap checks their freed pattern here.
  static constexpr unsigned kFreedBatch = 16;
  QuarantinedBlock freed[kFreedBatch];
  unsigned freed_count = 0;
  // The batch, moved to out (room for kFreedBatch), oldest first; live_lock held. Returns its count.
  unsigned take_freed(QuarantinedBlock* out) {
    const unsigned n = freed_count;
    for (unsigned i = 0; i < n; ++i) out[i] = freed[i];
    freed_count = 0;
    return n;
  }
  // The last stack walk from each place debug blocks capture stacks (allocation, free, realloc),
  // its value the depot id of the frames it returned: a loop that allocates or frees at one
  // place walks through return addresses it knows and does not store its stack in the depot
  // again. Touched only by the thread the paired thread heap is attached to.
  WalkMemo walks[3];
  bool capturing = false;  // block_ops.h's capture is running on this heap's thread
  DebugHeap* registry_next = nullptr;  // the next older debug heap; set before publication
};

// The live list, under d->live_lock: h at its head, or out of it. Inline: a debug free unlinks
// one block and links the blocks made since the last lock.
inline void link_live(DebugHeap* d, Header* h) {
  BRISK_ASSERT(d->live_lock.is_locked());
  h->prev = nullptr;
  h->next = d->live;
  if (d->live != nullptr) d->live->prev = h;
  d->live = h;
}
inline void unlink_live(DebugHeap* d, Header* h) {
  BRISK_ASSERT(d->live_lock.is_locked());
  if (h->prev != nullptr) h->prev->next = h->next;
  else d->live = h->next;
  if (h->next != nullptr) h->next->prev = h->prev;
  h->prev = h->next = nullptr;
}
// A full ring of blocks made: linked, under d's lock (add_made's rare case, out of line so that
// the common case saves no registers).
void link_full_made_ring(DebugHeap* d);
// d's owner: its new block h (header and check word written) into d's ring of blocks made;
// when the ring is full, its blocks are linked first, under the lock. No lock otherwise.
inline void add_made(DebugHeap* d, Header* h) {
  const std::uint32_t tail = d->made_tail.load(std::memory_order_relaxed);
  if (BRISK_UNLIKELY(tail - d->made_head.load(std::memory_order_acquire) == DebugHeap::kMadeBatch))
    link_full_made_ring(d);
  d->made[tail % DebugHeap::kMadeBatch] = h;
  d->made_tail.store(tail + 1, std::memory_order_release);
}
// Puts the blocks d's owner made since the last call on d's live list (live_lock held).
inline void link_made(DebugHeap* d) {
  BRISK_ASSERT(d->live_lock.is_locked());
  std::uint32_t head = d->made_head.load(std::memory_order_relaxed);
  const std::uint32_t tail = d->made_tail.load(std::memory_order_acquire);
  if (head == tail) return;
  for (; head != tail; ++head) link_live(d, d->made[head % DebugHeap::kMadeBatch]);
  d->made_head.store(head, std::memory_order_release);
}

// d->live_lock, held for its scope, with every block made before it on the live list.
class LiveLock {
 public:
  explicit LiveLock(DebugHeap* d) : d_(d) {
    d->live_lock.lock();
    link_made(d);
  }
  ~LiveLock() { d_->live_lock.unlock(); }
  LiveLock(const LiveLock&) = delete;
  LiveLock& operator=(const LiveLock&) = delete;

 private:
  DebugHeap* d_;
};

// The debug heap paired with h, an attached thread heap that the calling thread uses (its own,
// or one it borrowed), made on first use; nullptr when out of memory.
DebugHeap* make_debug_heap_of(Heap* h);
inline DebugHeap* debug_heap_of(Heap* h) {
  BRISK_ASSERT(heap_is_attached(h) && !h->is_debug);
  if (BRISK_LIKELY(h->debug != nullptr)) return static_cast<DebugHeap*>(h->debug);
  return make_debug_heap_of(h);
}
// Every debug heap ever made, newest first: never unlinked nor unmapped, so a walk needs no
// lock (a heap made during the walk is missed, as if made after it).
DebugHeap* first_debug_heap();

// Gives back u, a block of a span owned by a debug heap (the memory of a debug block that left
// the quarantine): pushed on its span when the calling thread owns that debug heap, else sent
// to the owner through the remote-free machinery (this thread's outgoing batch, or alone when
// the thread has no heap). A debug heap's queue never closes, so it always arrives.
void free_in_debug_heap(char* u);

// fork: the registry's lock, then every debug heap's live lock, newest heap first. No debug
// heap is made while the registry's lock is held, so none is missed.
void heaps_lock_all();
void heaps_unlock_all();
void heaps_reset_in_child();

}  // namespace brisk::debug
