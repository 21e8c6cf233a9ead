// Heap: one per thread, the thread cache, and its fast paths (alloc_small, free_fast). The call
// map from malloc to the OS, with the file of each step, is in the README ("Call map: from
// malloc to the OS"): keep it there, in one place.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/assert.h"
#include "core/chunk.h"
#include "core/config.h"
#include "core/free_key.h"
#include "core/hints.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/size_class.h"
#include "core/span.h"
#include "threadcache/remote_queue.h"

namespace brisk {

// Blocks freed by this thread, waiting to go to one other heap. count and bytes are written as
// relaxed atomics (store_shared) by the owner: the statistics read them from any thread.
struct OutgoingBatch {
  Heap* dest = nullptr;
  Block* head = nullptr;
  Block* tail = nullptr;
  std::uint32_t count = 0;
  std::size_t bytes = 0;
};

class alignas(BRISK_CACHELINE) Heap {
 public:
  constexpr explicit Heap(Span* empty) : current{}, installed{} {
    for (auto& s : current) s = empty;
    for (auto& s : installed) s = empty;
  }
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Hot: the fast paths read only this array. Never null: an exhausted class points at a span
  // with no free block (g_empty_span), which sends the allocation to alloc_refill. The owner
  // writes it through set_current; a debug-mode switch (debug_point_heaps_at_empty_span) may
  // store g_empty_span into any heap's entries from another thread, so every access is a
  // relaxed atomic one (a plain mov on x86-64: the fast path keeps its length).
  Span* current[kNumClasses];

  // Blocks other threads freed into this heap's spans.
  alignas(BRISK_CACHELINE) RemoteQueue incoming;

  // Cold: slow paths only.
  alignas(BRISK_CACHELINE) SpanList available[kNumClasses];  // spans with free blocks, not current
  // The span each class allocates from, as the owner last installed it: the slow paths'
  // notion of "current". It equals current[c] except after a debug switch pointed current[c]
  // at g_empty_span; the span stays the class's span, unlisted, and alloc_refill puts it back.
  Span* installed[kNumClasses];
  Span* all_spans = nullptr;    // every span this heap owns (for thread exit)
  // Their number, written by the owner as a relaxed atomic (store_shared): a free that may take
  // a parked heap reads it (heap_take_parked's bound on the work done in a free).
  std::uint32_t span_count = 0;
  Chunk* chunks = nullptr;      // chunks this heap claims pages from
  OutgoingBatch outgoing[kRemoteSlots];
  // 1 while the owner's outgoing_add changes a batch (remote_free.cc): another thread takes an
  // idle heap's batches (heap_take_outgoing) only when it sees 0 after its barrier.
  std::uint8_t out_busy = 0;
  // 1 while another thread takes the foreign cache (heap_take_outgoing): the owner, having set
  // out_busy, leaves the cache alone when it reads 1.
  std::uint8_t foreign_taken = 0;
  std::size_t released_since_purge = 0;  // bytes of spans released since the last purge check
  // Classes whose multi-page current span was kept when it emptied, oldest replaced first,
  // each class at most once (retained[c]).
  std::uint8_t retained_classes[kRetainedLargeSpans] = {};
  bool retained[kNumClasses] = {};
  // For each retained class (above), at most one more emptied span of it, kept listed in
  // available[c] instead of released (span_pages.cc's keep_spare); cleared when it is popped,
  // released, or its class leaves the retained FIFO.
  Span* spare[kNumClasses] = {};
  std::uint8_t retained_count = 0;
  std::uint8_t retained_next = 0;
  // The pages and class of the last kRecentReleases small spans this heap released
  // (span_pages.cc): a new span of the same class on such pages keeps its tail resident even
  // under BRISK_PURGE_SPAN_TAILS.
  static constexpr unsigned kRecentReleases = 4;
  struct RecentRelease {
    const Chunk* chunk = nullptr;
    std::uint64_t pages = 0;
    unsigned size_class = 0;
  } recent_releases[kRecentReleases];
  std::uint8_t recent_next = 0;
  // Span tails waiting to go back to the OS together (BRISK_PURGE_SPAN_TAILS: span_pages.cc's
  // heap_flush_span_tails), under slow_lock. Each names a span h owns: a span leaving h leaves
  // this list (heap_unlink_span).
  static constexpr unsigned kPendingTails = 16;
  struct PendingTail {
    Span* span = nullptr;
    std::uintptr_t from = 0;  // OS-page aligned, inside the span; the tail runs to its end
  } pending_tails[kPendingTails];
  std::uint8_t pending_tail_count = 0;
  std::uint64_t pending_tails_since_ms = 0;  // when the first of those waiting was added
  std::uint64_t aged_at_ms = 0;          // when the chunks' `aged` sets were taken
  // The owner's checks of its kept spans so far (heap_release_stale_kept_spans, from
  // heap_purge: Span::emptied_at_check), and whether one is under way (the spans it gives back
  // then start no purge of their own).
  std::uint32_t purge_checks = 0;
  bool purging = false;
  // Owner only (span_pages.h: heap_note_refill, and span_pages.cc's taking of a stale kept
  // span's page): alloc_refill calls so far; the count at each class's last refill; the count at
  // which a class's kept span was taken for another class (0: none since); and how many refills
  // a class must have gone without before its kept span may be taken (adaptive, between
  // kTakeKeptAfterMin and kTakeKeptAfterMax).
  static constexpr std::uint32_t kTakeKeptAfterMin = 8;
  static constexpr std::uint32_t kTakeKeptAfterMax = 4096;
  std::uint32_t refills = 0;
  std::uint32_t refilled_at[kNumClasses] = {};
  std::uint32_t kept_taken_at[kNumClasses] = {};
  std::uint32_t take_kept_after = kTakeKeptAfterMin;
  // Spans of freed medium blocks kept for the next ones (threadcache/medium.cc), oldest first,
  // under slow_lock.
  Span* medium_cache[kMediumCacheSlots] = {};
  std::uint8_t medium_cache_count = 0;
  std::size_t medium_cache_bytes = 0;
  // The large stash (medium.cc): the mapping of the last large block of at most kMediumMax
  // that this thread allocated and freed, kept for its next one; under slow_lock. The owner
  // also reads large_stash.base without the lock, as a hint that there is one (stored as a
  // relaxed atomic: the background thread empties the stash of an idle heap).
  LargeMapping large_stash;
  // The foreign cache (foreign_cache.h): other heaps' small blocks this thread freed, one chain
  // per class, kept for this thread's next allocations. foreign_bytes is written as a relaxed
  // atomic (store_shared): the statistics read it.
  Block* foreign[kNumClasses] = {};
  std::size_t foreign_bytes = 0;
  // Owner thread only: the thread is growing in the class (foreign_cache.h).
  bool foreign_wanted[kNumClasses] = {};
  // Strategy levers this heap caches for its per-free paths, read again when the strategy
  // epoch moves (heap_refresh_levers): a switch reaches the heap at its next refill or batch.
  std::size_t batch_bytes = kRemoteBatchBytes;
  std::size_t foreign_limit = 0;  // BRISK_FOREIGN_CACHE_BYTES
  bool foreign_always = false;    // BRISK_FOREIGN_CACHE_ALWAYS
  std::uint32_t span_keep = 0;    // BRISK_SPAN_KEEP (0: no limit)
  std::uint32_t lever_epoch = ~std::uint32_t{0};
  // The slow paths' lock (HeapSlowLock): the owner holds it while it changes its span lists,
  // its installed spans or a span's state outside the fast paths; the background thread takes
  // it to reclaim the queued frees of an idle heap (background.cc). Never on a fast path, and
  // uncontended unless the background thread is at work on this heap.
  SpinLock slow_lock;
  std::uint32_t slow_depth = 0;                // owner only: nesting of HeapSlowLock
  // Outermost HeapSlowLocks and full batches sent so far (owner writes): the background pass's
  // sign of a thread at work.
  std::atomic<std::uint32_t> slow_entries{0};
  bool serving = false;                        // under slow_lock: attached to a thread or borrowed
  // The background thread's own (under its pass lock): slow_entries at its last look, when it
  // last saw them move, and whether the heap has been idle for BRISK_IDLE_MS since (`idle`
  // is stored as a relaxed atomic: debug/ reads a debug heap's outside the pass lock).
  std::uint32_t idle_seen_entries = 0;
  std::uint64_t idle_active_ms = 0;
  bool idle = false;
  Heap* pool_next = nullptr;
  Heap* all_next = nullptr;  // every heap ever made, for the debug switch (never unlinked)
  std::uint32_t id = 0;
  // Parking (heap_lifecycle.cc, "Parked heaps"): kHeapParked while the owner waits in
  // pthread_join, since parked_at_ms; kHeapParkedTaken once another thread has taken what the
  // heap held. Beside id, which outgoing_add reads for every remote free: free_slow's look at
  // the owner's mark costs no other cache line.
  std::atomic<std::uint8_t> parked{0};
  std::atomic<std::uint64_t> parked_at_ms{0};

  // Statistics, read from any thread (heap_stats.cc); written on slow paths only, by the owner
  // (stats::add_single_writer) or, for thread_id, by attach and exit. Reset when the heap is
  // given to a new thread. Blocks in the outgoing batches are not yet counted as sent.
  std::atomic<std::uint64_t> remote_frees_sent{0};      // blocks freed into other heaps' spans, sent
  std::atomic<std::uint64_t> remote_frees_received{0};  // blocks of ours others freed, taken from our queue
  std::atomic<std::uint64_t> thread_id{0};              // the attached thread's OS id; 0: none
  // The process thread_id was read in (heap_reap_exited): a child made by _Fork (no fork
  // handlers) or vfork does not have its parent's threads, nor the parent the child's.
  std::atomic<std::uint32_t> thread_pid{0};
  // Debug mode (threadcache/debug_switch.h): the debug heap paired with this thread heap, made
  // at the thread's first debug block and kept with the heap through the pool; and whether this
  // heap is itself a debug heap.
  Heap* debug = nullptr;
  bool is_debug = false;
  // Under slow_lock: some installed span's pages went back while the heap was idle (Span's
  // idle_purged); the owner's next HeapSlowLock rebuilds those spans (heap_rebuild_idle_purged).
  bool idle_purged = false;
};

extern Span g_empty_span;
extern Heap g_sentinel_heap;  // every thread's heap until its first allocation
extern Heap g_orphan_heap;    // owner of spans whose thread exited; its queue is the orphan queue
// The heap of a thread whose key destructor has run. It owns no span and no block, so every
// allocation and free of that thread misses the fast paths, and the slow paths never attach a
// heap to the thread again (heap_borrow).
extern Heap g_exited_heap;
extern __thread Heap* t_heap __attribute__((tls_model("initial-exec")));
// Every heap ever made, newest first, linked through all_next (heaps are never unlinked).
Heap* all_heaps();

struct LargeHeader;

// Where a block brisk handed out lives: its span (small or medium) or its large header. Any
// other pointer (foreign, inside a block, in free pages) is reported as "brisk: <what> <p>:
// <why>" and aborts. Says nothing about whether the block is free.
struct BlockRef {
  Span* span;
  LargeHeader* large;
};
BlockRef checked_block(const void* p, const char* what);

// size: the size asked for (a debug block records it), in size_class.
void* alloc_refill(Heap* h, unsigned size_class, std::size_t size);
// Reports (and aborts on) a link in freed block b that decodes to no block: b was written after
// it was freed, or by an overflow of the block before it.
[[noreturn]] BRISK_COLD void free_list_damaged(const Block* b);
void free_slow(void* p);
// After a free into s by its owner h: s has just become empty (this free's own decrement of
// used reached 0) ...
void free_local_adjust(Span* s, Heap* h);
// ... or s was full and has a free block again.
void free_local_refilled(Span* s, Heap* h);

// With h's slow lock held, by its owner (HeapSlowLock): makes every installed span whose pages
// the idle purge gave back (background.cc) a sound span again (span_pages.cc).
void heap_rebuild_idle_purged(Heap* h);

inline Span* current_span(Heap* h, unsigned c) {
  return std::atomic_ref<Span*>(h->current[c]).load(std::memory_order_relaxed);
}
// Holds h's slow_lock for a scope; nests (the owner's slow paths call one another).
class HeapSlowLock {
 public:
  explicit HeapSlowLock(Heap* h) : h_(h) {
    if (h_->slow_depth++ == 0) {
      h_->slow_lock.lock();
      h_->slow_entries.store(h_->slow_entries.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (BRISK_UNLIKELY(h_->idle_purged)) heap_rebuild_idle_purged(h_);
    }
  }
  ~HeapSlowLock() {
    if (--h_->slow_depth == 0) h_->slow_lock.unlock();
  }
  HeapSlowLock(const HeapSlowLock&) = delete;
  HeapSlowLock& operator=(const HeapSlowLock&) = delete;

 private:
  Heap* h_;
};

// Whether s stays installed when a free empties it: it is h's current span of its class, and
// a one-page span, or one of a class among the retained (retain_empty_span).
inline bool stays_installed_when_empty(const Heap* h, const Span* s) {
  return s->kind == SpanKind::kSmall && h->installed[s->size_class] == s &&
         (s->page_count == 1 || h->retained[s->size_class]);
}
// Span::stays_when_empty of h's installed span of class c, which the free that empties it
// reads: rewritten wherever `installed` or `retained` changes.
inline void note_installed(Heap* h, unsigned c) {
  Span* s = h->installed[c];
  if (s != &g_empty_span) s->stays_when_empty = stays_installed_when_empty(h, s);
}

// The owner installs s as class c's span (or g_empty_span), holding h's slow lock.
inline void set_current(Heap* h, unsigned c, Span* s) {
  if (h->installed[c] != &g_empty_span) h->installed[c]->stays_when_empty = false;
  h->installed[c] = s;
  note_installed(h, c);
  std::atomic_ref<Span*>(h->current[c]).store(s, std::memory_order_relaxed);
}

// Fast path: must hold to stay here: the current span of the class has a free block (never
// so in debug mode: alloc_refill keeps every current span at g_empty_span then). Refill: the
// slow path, alloc_refill or a caller's wrapper of it (operator new's names the block's kind).
using RefillFn = void* (*)(Heap* h, unsigned size_class, std::size_t size);
template <RefillFn Refill = alloc_refill>
BRISK_ALWAYS_INLINE void* alloc_small(Heap* h, unsigned c, std::size_t size) {
  // A compiler barrier only: this load of current[c] stays after the stores of any allocation
  // inlined before it, as the purge in place's barrier needs (background.cc).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  Span* s = current_span(h, c);
  Block* b = s->free;
  if (BRISK_UNLIKELY(b == nullptr)) return Refill(h, c, size);
  auto a = reinterpret_cast<std::uintptr_t>(b);
  std::uintptr_t next = decoded_link(b, free_code(a).link_mask);
  // A free list stays inside one span, so a sound link is null or a 16-byte aligned address in
  // b's chunk: one test of (next ^ a) against the chunk-and-alignment bits. A damaged link
  // decodes to a random value and fails it (null fails it too, and is let through after).
  constexpr std::uintptr_t kForeignBits = ~kChunkMask | (kMinAlign - 1);
  if (kEncodeFreeLinks && BRISK_UNLIKELY(((next ^ a) & kForeignBits) != 0) && next != 0) free_list_damaged(b);
  // used first, then free as a release store (a plain mov on x86-64, which keeps the order of
  // the two stores): the idle purge (background.cc) reads used, free, used again, and when it
  // sees a pop's new free it must also see that pop's used.
  span_used_increment(s);
  std::atomic_ref<Block*>(s->free).store(reinterpret_cast<Block*>(next), std::memory_order_release);
  b->key = 0;  // a live block never carries the free key
  return b;
}

// Pushes a validated block on the free list of its span, which h owns.
BRISK_ALWAYS_INLINE void free_to_own_span(Heap* h, Span* s, Block* b, FreeCode code) {
  // Only the owner touches a span's free list and used count, without atomics.
  BRISK_ASSERT(s->owner.load(std::memory_order_relaxed) == h && s->used > 0);
  Block* old = s->free;
  set_link(b, old, code.link_mask);
  b->key = code.key;
  store_shared(s->free, b);  // the idle purge reads it (background.cc)
  // Release order (span_used_decrement): the background thread may read `used` of a span that
  // is not installed (background.cc) and give its pages away once every block is free; the
  // pages' next user must see this block's writes.
  // Two tests rather than one `||`: GCC then branches on the decrement's own flags instead of
  // saving them with a sete (two more instructions).
  if (BRISK_UNLIKELY(span_used_decrement(s))) {
    BRISK_ASSERT(!s->stays_when_empty || stays_installed_when_empty(h, s));
    if (s->stays_when_empty) return;
    return free_local_adjust(s, h);
  }
  if (BRISK_UNLIKELY(old == nullptr)) free_local_refilled(s, h);
}

// The span of a when a is the start of a carved block in a span h owns (a is in a brisk chunk,
// its span is owned by h, a is at a block boundary below the carved end), else nullptr. With
// the free-key test after it (the block is not free already), the one test of free_fast and of
// realloc's fast path. The key is computed only after the span tests pass: computing it first
// lengthened free by a register spill.
BRISK_ALWAYS_INLINE Span* own_carved_span(const Heap* h, std::uintptr_t a) {
  if (BRISK_UNLIKELY(region_kind(a) != kRegionChunk)) return nullptr;
  Span* s = chunk_of(a)->span_of(a);
  std::uintptr_t offset = a - reinterpret_cast<std::uintptr_t>(s->start);
  if (BRISK_UNLIKELY(s->owner.load(std::memory_order_relaxed) != h || !s->is_carved_block(offset)))
    return nullptr;
  return s;
}

// Fast path: must hold to stay here: own_carved_span finds p's span in this thread's heap and
// p does not carry the free key. The span leaves the fast path when it becomes empty or stops
// being full (free_local_adjust, free_local_refilled).
// Slow: free_slow or a caller's wrapper of it (operator delete's names the kind it expects),
// called with p and `extra` (a sized operator delete's size, which only a debug block checks:
// passed through untouched).
template <auto Slow = free_slow, class... Extra>
BRISK_ALWAYS_INLINE void free_fast(void* p, Extra... extra) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  Heap* h = t_heap;
  Span* s = own_carved_span(h, a);
  auto* b = static_cast<Block*>(p);
  if (BRISK_UNLIKELY(s == nullptr)) return Slow(p, extra...);
  FreeCode code = free_code(a);
  // A block of this thread's own span is never a debug block (those live in spans no thread
  // heap owns), so `extra` is not needed past here: free_slow reports the double free.
  if (BRISK_UNLIKELY(b->key == code.key)) return free_slow(p);
  free_to_own_span(h, s, b, code);
}

// Heap lifecycle (heap_lifecycle.cc), for the slow paths.
Heap* heap_for_this_thread();          // creates the thread's heap on first use; nullptr: no memory
// Gives back to the pool, detached, the heap of every thread that is gone without its key
// destructor having run (heap_lifecycle.cc); only_idle: only heaps the background pass has seen
// idle. The heaps given back.
std::size_t heap_reap_exited(bool only_idle = false);
inline bool heap_is_attached(const Heap* h) { return h != &g_sentinel_heap && h != &g_exited_heap; }

// Parked heaps (heap_lifecycle.cc): a thread about to wait in pthread_join parks its heap, and
// unparks it when the wait is over; meanwhile another thread may take what the heap holds, as
// if its thread had exited, and leave it empty for its thread to go on with.
inline constexpr std::uint8_t kHeapRunning = 0;
inline constexpr std::uint8_t kHeapParked = 1;
inline constexpr std::uint8_t kHeapParkedTaken = 2;
// How long a heap stays parked before it may be taken: a join that returns sooner costs its
// heap nothing, and a thread that joins often loses its spans at most once per this time.
inline constexpr std::uint64_t kParkedTakeAfterMs = 10;
// The most spans a heap may own for a free (free_slow) to take it: a take runs in that free,
// O(spans) at 0.15-0.2 us a span, so this bounds the stall of an unrelated thread's free to
// about 0.2 ms. A bigger parked heap is taken by the background pass only.
inline constexpr std::uint32_t kParkedTakeInFreeMaxSpans = 1024;
// By the calling thread: parks its heap and returns it, or nullptr when it has none (a thread
// that never allocated, or has exited, or is parked already). Until heap_unpark, the thread's
// own allocations and frees (a signal handler's) go through the slow paths as an exited
// thread's do, and never touch the parked heap.
Heap* heap_park();
// By the thread that parked h: waits for a take under way, and makes h its heap again.
void heap_unpark(Heap* h);
// Takes what o holds if o has been parked for after_ms at now (platform::now_ms) and
// its slow lock is free: o is detached as at thread exit (its spans with live blocks go to the
// central pools, where the threads that free those blocks adopt them) and reset, still its
// thread's. True if taken.
// after_ms: the time parked before a take, kParkedTakeAfterMs for a free of one of o's blocks.
bool heap_take_parked(Heap* o, std::uint64_t now, std::uint64_t after_ms = kParkedTakeAfterMs);
inline bool heap_is_parked(const Heap* o) { return o->parked.load(std::memory_order_relaxed) == kHeapParked; }
std::uint64_t heaps_taken_parked();  // takes so far (tests, statistics)
// Test hook, null in production: heap_take_parked calls it with the heap it has taken, before
// it lets go of the heap's slow lock (tests/parked_heap_test.cc).
extern std::atomic<void (*)(Heap* h)> g_take_parked_test_hook;
// A heap attached to no thread, for one allocation of an exited thread; nullptr: no memory.
// heap_give_back detaches it again, as at thread exit: the block's span becomes an orphan.
Heap* heap_borrow();
void heap_give_back(Heap* h);
template <class Alloc>
void* alloc_with_borrowed_heap(Alloc alloc) {
  Heap* h = heap_borrow();
  if (h == nullptr) return nullptr;
  void* p = alloc(h);
  heap_give_back(h);
  return p;
}
// For another heap (brisk_trim, the background pass for an idle heap), if its slow lock is free:
// gives back its medium cache, its classes' spares and its pending span tails, which its owner
// touches only under that lock (unlike its current spans, which its fast paths use without it).
// Returns the bytes.
std::size_t heap_give_back_kept_tried(Heap* h);
// Test hook, null in production: heap_give_back_kept_tried calls it with h once it holds h's
// slow lock, so a test can hold that lock there (tests/fork_heap_lock_test.cc).
extern std::atomic<void (*)(Heap* h)> g_give_back_test_hook;
std::size_t heap_collect(Heap* h);     // brisk_thread_collect's part for one heap (the large cache is
                                       // flushed once by the caller); returns bytes given back to the OS
LockCounts heap_pool_lock_counts();    // the pool of exited threads' heaps (brisk_get_lock_stats)
// BRISK_SPAN_KEEP: h holds as many spans with free blocks of a small span's class, besides its
// current one and that span, as it keeps (options.cc): `others` of them. By the owner (its
// drain, its frees), under h's slow lock: the background thread may take spans off an idle
// heap's lists (heap_give_back_kept_tried). Never a debug heap's: its spans must not become
// orphans a thread heap could adopt (debug_switch.h).
inline bool heap_keeps_enough(const Heap* h, std::size_t others) {
  return h->span_keep != 0 && !h->is_debug && others >= h->span_keep;
}
// The same for any span s (medium ones are never kept this way), counting h's list of its class.
inline bool heap_keeps_enough(const Heap* h, const Span* s) {
  return s->kind == SpanKind::kSmall && heap_keeps_enough(h, h->available[s->size_class].count);
}
// Re-reads the strategy's levers into h if the strategy changed since h last read them.
void heap_refresh_levers_slow(Heap* h);
inline bool heap_levers_stale(const Heap* h) { return h->lever_epoch != options::strategy_epoch(); }
inline void heap_refresh_levers(Heap* h) {
  if (BRISK_UNLIKELY(heap_levers_stale(h))) heap_refresh_levers_slow(h);
}

// The thread cache's slow entry points for the layers above (threadcache/thread_cache.cc).
// A medium block from the calling thread's heap, whatever state the thread is in (no heap yet,
// or exited); nullptr when out of memory.
void* alloc_medium_here(std::size_t size, bool zero, std::size_t room = 0);  // room: alloc_medium's
// Large blocks of the calling thread, through its large stash (medium.cc) when it has a heap.
void* large_alloc_here(std::size_t size, std::size_t alignment, bool zero, bool grows = false);
void large_free_here(void* p, LargeHeader* lh);
std::size_t thread_collect();  // brisk_thread_collect; returns bytes given back to the OS
std::size_t process_trim();    // brisk_trim
void process_init();

}  // namespace brisk
