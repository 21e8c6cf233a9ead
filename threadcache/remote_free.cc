// Remote frees between heaps. See remote_free.h.
#include "threadcache/remote_free.h"

#include <atomic>

#include "core/chunk.h"
#include "core/platform.h"
#include "core/report.h"
#include "core/stats.h"
#include "threadcache/foreign_cache.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"
#include "threadcache/span_pages.h"

namespace brisk {

std::atomic<void (*)(Heap*)> g_switch_destination_test_hook{nullptr};
std::atomic<void (*)(Heap*)> g_take_outgoing_test_hook{nullptr};
std::atomic<void (*)(Heap*)> g_remote_medium_test_hook{nullptr};

void send_chain(Heap* dest, Block* first, Block* last, std::size_t bytes) {
  // Counted before the push, on the sender's stripe; the consumer uncounts it after its take,
  // on its own: the sum is exact once both are done (stats::sum).
  stats::add(&stats::Stripe::remote_queued_bytes, static_cast<std::int64_t>(bytes));
  if (dest != &g_orphan_heap && dest->incoming.push(first, last)) return;
  // To the orphan queue: dest's spans are orphans, or dest has exited (its queue is closed) and
  // its spans are, or are about to be, orphans. Counted for brisk_get_lock_stats.
  std::uint64_t retries = 0;
  g_orphan_heap.incoming.push(first, last, &retries);
  orphan_queue_counted_push(retries);
}

// Taking an idle heap's batches (heap_take_outgoing) from another thread. The owner appends to
// them without a lock (outgoing_add), and an append reads the batch before writing it, so the
// taker must know that no append is under way, and that none starts until it is done. An
// asymmetric Dekker fence: the owner stores out_busy = 1, then (a compiler barrier only) reads
// the slot's dest; the taker swaps every slot's dest for kTakenMark, then runs a memory barrier
// on every thread of the process (platform::barrier_all_threads), then reads out_busy. If the
// owner's store came before the barrier reached its CPU, the taker sees it and gives up; if
// after, the owner's read sees the mark, and the append goes to switch_destination, which waits
// for the taker on the heap's slow lock. An append's last store is out_busy = 0 (release), so
// a taker that reads 0 sees everything it wrote. The mark is only ever read there: an append
// under way uses the dest it was given, and every other reader holds the slow lock.
// The foreign cache (foreign_cache.h) is taken with the same barrier: the taker stores
// foreign_taken = 1 before it, the owner reads foreign_taken with out_busy set and leaves the
// cache alone when it is 1, and the taker clears it (release) when it is done.
namespace {

Heap* const kTakenMark = &g_exited_heap;  // never a batch's destination (it owns no span)

std::atomic_ref<Heap*> dest_of(OutgoingBatch& o) { return std::atomic_ref<Heap*>(o.dest); }

void batch_reset(OutgoingBatch& o) {
  o.head = o.tail = nullptr;
  store_shared(o.count, 0u);
  store_shared(o.bytes, std::size_t{0});
}

BRISK_NOINLINE void flush_batch(Heap* h, OutgoingBatch& o, Heap* dest) {
  if (o.count != 0) {
    send_chain(dest, o.head, o.tail, o.bytes);
    stats::add_single_writer(h->remote_frees_sent, o.count);
  }
  batch_reset(o);
}

// A full batch: sent; then the strategy's levers are read again if it changed, and the queue
// is drained. A thread that frees other threads' blocks without allocating (a consumer, or two
// workers freeing each other's blocks) never reaches alloc_refill, which drains the queue; what
// others freed into its spans would wait there, resident, until it allocated again.
BRISK_NOINLINE void batch_full(Heap* h, OutgoingBatch& o, Heap* dest) {
  flush_batch(h, o, dest);
  out_busy_end(h);
  // A thread that only frees other threads' blocks (a consumer) may never take its slow lock:
  // counted as a slow path, so the background pass does not take it for idle (and take its
  // batches and purge its spans while it works).
  h->slow_entries.store(h->slow_entries.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  heap_refresh_levers(h);
  if (!h->incoming.empty()) {
    HeapSlowLock lock(h);
    heap_drain_incoming(h);
  }
}

// Another thread is taking h's batches (its mark is in the slot): wait for it on the slow lock,
// then append again.
void wait_for_taker(Heap* h, Heap* dest, Block* b, std::size_t size) {
  out_busy_end(h);
  { HeapSlowLock wait(h); }
  outgoing_add(h, dest, b, size);
}

BRISK_NOINLINE void switch_destination(Heap* h, Heap* dest, Block* b, std::size_t size) {
  OutgoingBatch& o = h->outgoing[dest->id & (kRemoteSlots - 1)];
  Heap* old = dest_of(o).load(std::memory_order_acquire);
  if (old == kTakenMark) return wait_for_taker(h, dest, b, size);
  flush_batch(h, o, old);
  if (auto hook = g_switch_destination_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook(h);
  // A taker may have swapped in its mark since the load above (it then sees out_busy and puts
  // `old` back): never overwrite the mark, or the taker's view of the slot and the next append's
  // would part (a helper's stress program sent a chain twice, or to a null dest).
  if (!dest_of(o).compare_exchange_strong(old, dest, std::memory_order_relaxed, std::memory_order_relaxed))
    return wait_for_taker(h, dest, b, size);
  outgoing_add(h, dest, b, size);
}

}  // namespace

// The calls leave only through tail calls (flush_batch, switch_destination): with a call in the
// middle GCC saved six registers on every remote free (callgrind: 12 instructions a free more).
void outgoing_add(Heap* h, Heap* dest, Block* b, std::size_t size) {
  out_busy_begin(h);
  OutgoingBatch& o = h->outgoing[dest->id & (kRemoteSlots - 1)];
  // Acquire: after a taker put the dest back, its reset of the batch happens before this append.
  if (BRISK_UNLIKELY(dest_of(o).load(std::memory_order_acquire) != dest)) return switch_destination(h, dest, b, size);
  set_link(b, o.head);
  o.head = b;
  if (o.tail == nullptr) o.tail = b;
  // Relaxed atomic stores (the same movs as plain ones): the statistics read partial batches.
  std::size_t bytes = o.bytes + size;
  std::uint32_t count = o.count + 1;
  store_shared(o.bytes, bytes);
  store_shared(o.count, count);
  if (count >= kRemoteBatch || bytes >= h->batch_bytes) return batch_full(h, o, dest);
  out_busy_end(h);
}

// A medium span holds one block, so a remote free of it empties the span: rather than queue it to
// an owner that may not run for a while (on prodcons, frees queued to descheduled producers held
// 30-60 MiB, mostly medium blocks, while the other producers took fresh pages), the freer gives
// the pages back to the chunk itself, where any heap's next span takes them (not to the owner's
// medium cache: prodcons took 0.94 [0.93, 0.95] of the time this way, and the realloc-chain
// workload, whose blocks move between threads, kept 2-6% less memory). Sound as the
// background thread's reclaim is (background.cc): this free claimed the block, so s has no live
// block; a medium span is never installed, so neither of the owner's fast paths reads it; and
// the owner's slow paths, which change its span list, wait on its slow lock. Only tried: a
// busy owner gets the block through its queue.
bool free_remote_medium(Heap* h, Heap* owner, Span* s) {
  if (owner == &g_orphan_heap || !owner->slow_lock.try_lock()) return false;
  if (auto hook = g_remote_medium_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook(owner);
  // Under the lock: a heap that stopped serving has handed its spans to the central pools.
  bool released = owner->serving && s->owner.load(std::memory_order_acquire) == owner;
  if (released) {
    BRISK_ASSERT(s->kind == SpanKind::kMedium && s->used == 1);
    std::atomic_ref<std::uint32_t>(s->used).store(0, std::memory_order_relaxed);
    heap_release_span(owner, s);
    stats::add(owner->remote_frees_received, 1);
  }
  owner->slow_lock.unlock();
  // An atomic add: a taker of h's batches (heap_take_outgoing) may add to it meanwhile.
  if (released) stats::add(h->remote_frees_sent, 1);
  return released;
}

void heap_flush_outgoing(Heap* h) {
  for (auto& o : h->outgoing) flush_batch(h, o, o.dest);
}

std::size_t heap_take_outgoing(Heap* h) {
  bool any = load_shared(h->foreign_bytes) != 0;
  for (auto& o : h->outgoing) any = any || load_shared(o.count) != 0;
  if (!any) return 0;
  Heap* dests[kRemoteSlots];
  for (unsigned i = 0; i < kRemoteSlots; ++i) dests[i] = dest_of(h->outgoing[i]).exchange(kTakenMark, std::memory_order_seq_cst);
  std::atomic_ref<std::uint8_t>(h->foreign_taken).store(1, std::memory_order_seq_cst);
  bool quiet = platform::barrier_all_threads();
  if (auto hook = g_take_outgoing_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook(h);
  quiet = quiet && std::atomic_ref<std::uint8_t>(h->out_busy).load(std::memory_order_acquire) == 0;
  std::size_t bytes = quiet ? foreign_cache_send(h) : 0;
  std::atomic_ref<std::uint8_t>(h->foreign_taken).store(0, std::memory_order_release);
  for (unsigned i = 0; i < kRemoteSlots; ++i) {
    OutgoingBatch& o = h->outgoing[i];
    if (quiet && o.count != 0) {
      bytes += o.bytes;
      send_chain(dests[i], o.head, o.tail, o.bytes);
      stats::add(h->remote_frees_sent, o.count);  // the owner's add_single_writer is not under way
      batch_reset(o);
    }
    // Back, unless an append under way (then quiet is false) switched the slot meanwhile.
    Heap* mark = kTakenMark;
    dest_of(o).compare_exchange_strong(mark, dests[i], std::memory_order_release, std::memory_order_relaxed);
  }
  return bytes;
}

void note_chain_taken(std::size_t bytes) {
  if (bytes != 0) stats::add(&stats::Stripe::remote_queued_bytes, -static_cast<std::int64_t>(bytes));
}

void heap_drain_incoming(Heap* h) { heap_process_blocks(h, h->incoming.take_all()); }

namespace {

// The spans of h that a drain's blocks made not full again (they had no free block), for the
// span keep below; past kMax the rest are not considered. A span the drain empties leaves the
// list: it may be given back, and its chunk unmapped with it.
struct Refilled {
  static constexpr unsigned kMax = 64;
  Span* spans[kMax];
  unsigned count = 0;
  void add(Span* s) {
    if (count < kMax) spans[count++] = s;
  }
  void forget(const Span* s) {
    for (unsigned i = 0; i < count; ++i)
      if (spans[i] == s) {
        spans[i] = spans[--count];
        return;
      }
  }
};

// Blocks that arrived in h's queue: b and the blocks chained after it that lie in the same span
// (a consumer's frees of one producer's blocks come in such runs). The span may have changed
// owner since they were sent: then b alone is sent on. Adds the blocks' bytes and count, and
// returns the block after them in the chain.
// A chain is linked as a span's free list is (set_link with each block's own code) and each of
// its blocks carries its free key (the remote free's exchange), so a run of h's span goes onto
// the span's free list as it is: its last block is linked to the list's head, and `used` drops
// by the run's length once. Per block, only the link's check, the span lookup and the carved
// test remain (free_to_own_span for each block was 63 instructions a block of the drain under
// mimalloc-bench's xmalloc-test).
Block* process_owned_run(Heap* h, Block* b, Refilled* refilled, std::size_t* bytes, std::int64_t* blocks) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  Span* s = chunk_of(a)->span_of(a);
  const std::size_t size = s->block_size;
  Heap* owner = s->owner.load(std::memory_order_acquire);
  if (owner != h) {
    Block* next = chain_next(b);
    if (owner == nullptr) fatal_pointer_error("invalid free of", b, "its span is not in use");
    send_chain(owner, b, b, size);
    *bytes += size;
    ++*blocks;
    return next;
  }
  Block* last = b;
  std::uint32_t k = 0;
  Block* next;
  for (;;) {
    const auto l = reinterpret_cast<std::uintptr_t>(last);
    if (!s->in_carved_part(l)) fatal_pointer_error("invalid free of", last, "never handed out");
    BRISK_ASSERT(last->key == free_key(last));
    ++k;
    next = chain_next(last);
    if (next == nullptr) break;
    const auto n = reinterpret_cast<std::uintptr_t>(next);
    if (chunk_of(n)->span_of(n) != s) break;
    last = next;
  }
  *bytes += size * k;
  *blocks += k;
  // Only the owner touches a span's free list and used count (free_to_own_span).
  BRISK_ASSERT(s->used >= k);
  Block* old = s->free;
  set_link(last, old);
  store_shared(s->free, b);  // the idle purge reads it (background.cc)
  // Read before the subtraction: s is not to be read after one that empties it.
  const bool refills = old == nullptr && s->kind == SpanKind::kSmall;
  // What the run's first free would have done one block at a time: a full span given a block
  // back, which that block alone does not empty, is listed again. Called before the subtraction,
  // which the first free would have made one block of: free_local_refilled reads neither the
  // span's free list nor its count.
  if (old == nullptr && s->used > 1) free_local_refilled(s, h);
  if (span_used_subtract(s, k)) {  // release order, as free_to_own_span's decrement
    refilled->forget(s);
    BRISK_ASSERT(!s->stays_when_empty || stays_installed_when_empty(h, s));
    if (!s->stays_when_empty) free_local_adjust(s, h);
  } else if (refills) {
    refilled->add(s);
  }
  return next;
}

// BRISK_SPAN_KEEP (options.cc): of the spans the drain gave room to, those past the keep of
// their class go to the central pool, for whichever thread runs short of the class. Only room
// that other threads' frees made (this thread's own frees keep their spans: a thread freeing
// what it allocated, in any order, stays on its fast path), and only after the whole chain, so
// that the chain's other blocks of a span are freed into it here rather than forwarded one by
// one to the orphan queue. Under h's slow lock, which every drain holds.
void shed_refilled(Heap* h, const Refilled& refilled) {
  if (!h->serving || refilled.count == 0) return;
  for (unsigned i = 0; i < refilled.count; ++i) {
    Span* s = refilled.spans[i];
    // Still h's with a live block (a span the drain emptied was forgotten), and listed: not
    // installed.
    if (s->owner.load(std::memory_order_relaxed) != h || !s->listed) continue;
    SpanList& list = h->available[s->size_class];
    if (!heap_keeps_enough(h, list.count - 1)) continue;
    list.remove(s);
    heap_unlink_span(h, s);
    orphan_span(s);
  }
}

}  // namespace

void heap_process_blocks(Heap* h, Block* b) {
  std::size_t bytes = 0;
  std::int64_t blocks = 0;
  Refilled refilled;
  while (b != nullptr) b = process_owned_run(h, b, &refilled, &bytes, &blocks);
  shed_refilled(h, refilled);
  note_chain_taken(bytes);
  if (blocks != 0) stats::add_single_writer(h->remote_frees_received, blocks);
}

}  // namespace brisk
