// The background thread. See background.h.
//
// What it returns, each pass: the free pages of every chunk that stayed unused for
// BRISK_PURGE_DELAY_MS (chunk_decay_all: whoever owns the chunk, abandoned ones too), blocks
// in the orphan queue, and empty abandoned chunks. All of it through the same protocols any
// thread uses (claim before decommit, the central pools' locks).
//
// And the frees other threads queued to an idle heap (one whose owner ran no slow path for
// BRISK_IDLE_MS): a thread blocked for good (a pool thread waiting for work) never drains
// its queue, and the spans of those blocks would stay resident for ever. The background thread
// takes the queue under the heap's slow lock and gives back each span all of whose blocks it
// holds: then no block of it is live (`used` counts live and queued blocks alike), it is not
// installed, so neither of the owner's fast paths can touch it, and its owner's slow paths wait
// on the lock. Blocks of spans that still hold a live block go back to the queue.
//
// An idle heap's medium cache (threadcache/medium.h) and its classes' spares (span_pages.cc) are
// given back too, under the same lock; and the pages of its installed spans that hold no live
// block (purge in place, below), which its fast paths use without the lock.
//
// When a pass finds nothing left to age, the thread backs off, doubling its sleep up to
// BRISK_IDLE_MS, so an idle process wakes it a few times a second at most; while memory is
// being freed it passes every purge delay (at least kMinSleepMs).
#include "threadcache/background.h"

#include <algorithm>
#include <atomic>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"
#include "threadcache/debug_switch.h"
#include "threadcache/heap.h"
#include "threadcache/orphans.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {
namespace {

constexpr std::uint64_t kMinSleepMs = 20;

// 0: not started (or ended); 1: starting or running.
std::atomic<int> g_state{0};
// The thread runs (set by it first thing, cleared as it ends): g_state turns 1 before the
// thread exists, and a scan that counted it then would take another thread of the program for it.
std::atomic<bool> g_running{false};
// Bumped by background_heaps_gone, so that the thread's sleep ends (platform::wait_while_equal).
std::atomic<std::uint32_t> g_wake{0};
std::atomic<std::size_t> g_bytes_returned{0};

// The pass's own state, under g_pass_lock (a test may call background_pass beside the thread).
SpinLock g_pass_lock;
std::uint64_t g_last_decay_ms = 0;
std::atomic<std::uint64_t> g_last_reap_ms{0};  // outside the pass lock: tests run passes too
std::uint64_t g_backoff_ms = kMinSleepMs;

// Spans seen in one reclaim, with the queued blocks counted for each: an open-addressed table
// under g_pass_lock (zero-filled .bss, touched only when a reclaim runs; the slots used are
// listed so that only they are cleared). Past 3/4 full, or past kMaxProbes, a span is left
// for a later pass (its blocks are kept). Each reclaim walks the whole queue, so the table is
// large enough (16 Ki spans: 1 GiB of 64 KiB spans) that a big queue is not walked often.
constexpr unsigned kSpanSlotsLog2 = 14;
constexpr unsigned kSpanSlots = 1u << kSpanSlotsLog2;
constexpr unsigned kMaxSpans = kSpanSlots / 4 * 3;
constexpr unsigned kMaxProbes = 32;
struct SpanCount {
  Span* span;
  std::uint32_t count;  // its blocks in the chain; or kReleased, kPinned
};
constexpr std::uint32_t kReleased = ~std::uint32_t{0};  // to give back
constexpr std::uint32_t kPinned = kReleased - 1;        // never given back in this reclaim
constexpr std::uint32_t kPurged = kPinned - 1;          // installed, purged in place (below)
struct SpanTable {
  alignas(kOsPageSize) SpanCount slots[kSpanSlots];
  std::uint16_t used[kMaxSpans];  // indices of the slots in use
  unsigned count;
  // Bit p: page p of slots (an OS page) has been accessed. A first read of an untouched page
  // maps the kernel's shared zero page, and a write to it after that faults again to copy it,
  // with a TLB shootdown to every other CPU running the process (an interrupt each, through the
  // hypervisor on a VM: about 20 us, against 1.5 for a first write, measured here with another
  // thread spinning). So find_slot never reads a page it has not accessed (all its slots are
  // empty) and makes its first access to one a write, as touch_counters does each pass for this
  // word's page; used[] is written before it is read. Before, a pass read the home slot of every
  // span it looked up: the reclaim passes of the producer/consumer, larson and churn workloads
  // sent 27-63 shootdowns a run this way, the most of any of brisk's own code (perf record -e
  // tlb:tlb_flush, with call graphs), and a lookup that missed left its page mapped.
  std::uint64_t accessed_pages;
} g_spans;
constexpr std::size_t kSlotsPerPage = kOsPageSize / sizeof(SpanCount);
static_assert(sizeof(g_spans.slots) / kOsPageSize <= 64, "accessed_pages has a bit per page of slots");

// Before a pass reads count or accessed_pages: a write to their page (an atomic or of nothing,
// which the CPU performs as a write).
void touch_counters() {
  std::atomic_ref<std::uint64_t>(g_spans.accessed_pages).fetch_or(0, std::memory_order_relaxed);
}

// The slot of s, inserted if insert and there is room; nullptr if none.
SpanCount* find_slot(Span* s, bool insert) {
  // Fibonacci hashing of the whole address: the top bits of the product depend on every bit of
  // it (span descriptors differ only in their chunk and index within it).
  auto i = static_cast<unsigned>((reinterpret_cast<std::uintptr_t>(s) * 0x9e3779b97f4a7c15ull) >> (64 - kSpanSlotsLog2));
  for (unsigned probes = 0; probes < kMaxProbes; ++probes, i = (i + 1) & (kSpanSlots - 1)) {
    const std::uint64_t page = std::uint64_t{1} << (i / kSlotsPerPage);
    if ((g_spans.accessed_pages & page) == 0) {  // never accessed: slot i is empty
      if (!insert || g_spans.count == kMaxSpans) return nullptr;
      *static_cast<Span* volatile*>(&g_spans.slots[i & ~(kSlotsPerPage - 1)].span) = nullptr;  // the first access
      g_spans.accessed_pages |= page;
    }
    SpanCount& e = g_spans.slots[i];
    if (e.span == s) return &e;
    if (e.span == nullptr) {
      if (!insert || g_spans.count == kMaxSpans) return nullptr;
      e = SpanCount{s, 0};
      g_spans.used[g_spans.count++] = static_cast<std::uint16_t>(i);
      return &e;
    }
  }
  return nullptr;
}

void clear_spans() {
  for (unsigned k = 0; k < g_spans.count; ++k) g_spans.slots[g_spans.used[k]] = SpanCount{};
  g_spans.count = 0;
}

// Held by the background thread for each pass, and by background_pause_within: outermost of brisk's
// locks (nothing else is held when it is taken).
SpinLock g_pass_gate;

// The thread must never be what keeps the process alive. A program whose main thread calls
// pthread_exit ends when its last thread does (glibc's exit(0) in that thread, or the kernel
// once no thread is left); were this thread to run on, the process would never end (a Python
// child forked from a thread, whose last thread returned, waited for ever: test_threading's
// test_3_join_in_forked_from_thread). So it counts the process's other running threads
// (platform::other_running_threads, one read of /proc/self/stat), and ends when there are none:
// it is the last thread, and glibc ends the process with exit(0) on it, as the program's last
// thread would have, with the program's signal mask back. When the last attached heap goes it
// is woken (background_heaps_gone); the exiting thread still runs then, so while no heap is
// attached it counts at every wake, looking again after kLonelyFirstMs, doubling up to
// kCountEveryMs. While heaps are attached it counts once per kCountEveryMs (a thread gone by
// the exit system call leaves its heap attached until a pass reaps it, which a lever switched
// off never does). A count it cannot read ends it only when no heap is attached either (it
// starts again with the next second heap, background_maybe_start).
constexpr std::uint64_t kLonelyFirstMs = 1;
constexpr std::uint64_t kCountEveryMs = 1000;

void* background_main(void*) {
  g_running.store(true, std::memory_order_release);
  platform::name_this_thread("brisk-bg");
  std::uint64_t lonely_sleep = kLonelyFirstMs;
  std::uint64_t counted_at = 0;
  for (;;) {
    // Read before heaps_live: a heap that goes after this read changes the word, and the wait
    // below returns at once.
    const std::uint32_t wake = g_wake.load(std::memory_order_acquire);
    std::uint64_t sleep = 1000;  // lever off (a strategy switch may turn it on again)
    if (options::get(options::Id::kBackground) != 0) {
      LockGuard gate(g_pass_gate);
      sleep = background_pass(platform::now_ms());
    }
    const bool no_heap = stats::g.heaps_live.load(std::memory_order_acquire) == 0;
    const std::uint64_t now = platform::now_ms();
    if (no_heap || now - counted_at >= kCountEveryMs) {
      counted_at = now;
      const long others = platform::other_running_threads();
      if (others == 0 || (others < 0 && no_heap)) break;
    }
    if (no_heap) {
      sleep = std::min(sleep, lonely_sleep);
      lonely_sleep = std::min(lonely_sleep * 2, kCountEveryMs);
    } else {
      lonely_sleep = kLonelyFirstMs;
    }
    platform::wait_while_equal(&g_wake, wake, sleep);
  }
  platform::restore_starter_signal_mask();
  g_running.store(false, std::memory_order_release);
  g_state.store(0, std::memory_order_release);
  return nullptr;
}

}  // namespace

void background_maybe_start() {
  if (g_state.load(std::memory_order_relaxed) != 0) return;
  if (stats::g.heaps_live.load(std::memory_order_relaxed) < 2) return;
  if (options::get(options::Id::kBackground) == 0) return;
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  if (!platform::start_thread(background_main, nullptr)) g_state.store(0, std::memory_order_relaxed);
}

void background_heaps_gone() {
  if (g_state.load(std::memory_order_relaxed) == 0) return;
  g_wake.fetch_add(1, std::memory_order_release);
  platform::wake_all(&g_wake);
}

void background_reset_in_child() {
  g_state.store(0, std::memory_order_relaxed);
  g_running.store(false, std::memory_order_relaxed);
  g_pass_gate.reset_after_fork();  // the parent's thread may have held it: it is not here
}

bool background_pause_within(std::uint64_t ms, std::size_t* threads) {
  if (!g_pass_gate.lock_within(ms)) return false;
  *threads = g_running.load(std::memory_order_acquire) ? 1 : 0;
  return true;
}
void background_resume() { g_pass_gate.unlock(); }
void background_locks_acquire() { g_pass_lock.lock(); }
void background_locks_release() { g_pass_lock.unlock(); }
void background_locks_reset_in_child() { g_pass_lock.reset_after_fork(); }
LockCounts background_lock_counts() { return g_pass_lock.counts(); }

std::size_t background_bytes_returned() { return g_bytes_returned.load(std::memory_order_relaxed); }

namespace {

// Purge in place: the pages of an installed span with no live block go back to the OS while the
// span stays installed, for a heap whose owner may never run again (its fast paths use its
// installed spans without the lock, so no other thread may release them).
//
// With h's slow lock held (the owner's slow paths wait): for each candidate class c (installed
// span s, `queued` blocks of it in the chain taken from h's queue, used == queued), point
// current[c] away from s; then one memory barrier on every thread of the process
// (platform::barrier_all_threads, membarrier); then decide each (purge_in_place_decide).
// The barrier is needed: the owner's pops have no fence, so without it a pop's stores could
// still sit in its store buffer while its next allocation's load of current[c] (already done)
// took the next block too, and the purge would see neither. After the barrier, every store of
// the owner before it is visible, and every load of current[c] after it sees the redirect: at
// most one allocation can still touch s, one that read current[c] before the barrier and has
// not stored yet, and it takes the head it reads. Its stores are used + 1, then the new head
// (release, alloc_small). Read here: used, the head, used again (acquire). If the pop stored
// its head by the time the head is read, the second read sees its used; otherwise it takes the
// head read here, whose pages the purge keeps. Either way no block but that head can be live,
// and the owner's next slow path (heap_rebuild_idle_purged) knows how many are: used less the
// queued blocks dropped here. A span found busy stays pointed away: the owner's next
// allocation of the class puts it back (alloc_refill).
struct PurgeCandidate {
  Span* span;
  SpanCount* entry;
};

bool purge_in_place_decide(Heap* h, Span* s, std::uint32_t queued) {
  auto used = [s] { return std::atomic_ref<std::uint32_t>(s->used).load(std::memory_order_acquire); };
  if (used() != queued) return false;
  Block* head = std::atomic_ref<Block*>(s->free).load(std::memory_order_acquire);
  if (used() != queued) return false;
  s->idle_head = head;
  store_shared(s->idle_absorbed, queued);  // the statistics read both (heap_stats.cc)
  store_shared(s->idle_purged, true);
  h->idle_purged = true;
  return true;
}

// The pages of s marked by purge_in_place_decide, but those of the head block's bytes, go back
// to the OS. Returns the bytes.
std::size_t purge_in_place(Span* s) {
  auto* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  auto begin = reinterpret_cast<std::uintptr_t>(ch->page_address(s->first_page));
  std::uintptr_t end = begin + (std::size_t{s->page_count} << kPageShift);
  std::uintptr_t keep_begin = end, keep_end = end;
  if (s->idle_head != nullptr) {
    auto a = reinterpret_cast<std::uintptr_t>(s->idle_head);
    keep_begin = a & ~(kOsPageSize - 1);
    keep_end = round_to_os_page(a + s->block_size);
  }
  if (keep_begin > begin) {
    platform::decommit(reinterpret_cast<void*>(begin), keep_begin - begin);
    chunk_forget_os_pages(ch, begin, keep_begin);
  }
  if (end > keep_end) {
    platform::decommit(reinterpret_cast<void*>(keep_end), end - keep_end);
    chunk_forget_os_pages(ch, keep_end, end);
  }
  // Counted: the pages that may have been resident (the carved part, and the 64 KiB pages it
  // was given resident past it), less the kept ones; not the untouched rest of the span.
  std::uintptr_t carved_end = round_to_os_page(reinterpret_cast<std::uintptr_t>(s->start) + s->carved_bytes());
  auto counted = [&](std::uintptr_t from, std::uintptr_t to) {
    std::size_t bytes = 0;
    for (std::uintptr_t p = from; p < to; p += kOsPageSize) {
      bool maybe_resident = p < carved_end || (s->resident_pages >> ((p - begin) >> kPageShift) & 1) != 0;
      if (maybe_resident) bytes += kOsPageSize;
    }
    return bytes;
  };
  return counted(begin, keep_begin) + counted(keep_end, end);
}

// reclaim_queued_frees, g_pass_lock held (the span table is its). purge_installed: also purge
// the installed spans without a live block in place (above), adding their bytes to *purged.
std::size_t reclaim_locked(Heap* h, bool purge_installed, std::size_t* purged = nullptr) {
  if ((h->incoming.empty() && !purge_installed) || !h->slow_lock.try_lock()) return 0;
  std::size_t bytes = 0;
  // A debug heap never stops serving: it keeps its spans through the pool (debug_switch.h).
  // Its installed spans are not purged: it allocates through g_empty_span anyway.
  purge_installed = purge_installed && h->serving && !h->is_debug;
  // Its partial outgoing batches first: their blocks may be all that keeps other heaps' spans
  // (and, once sent back, its own) from emptying.
  if (purge_installed) heap_take_outgoing(h);
  if (h->serving || h->is_debug) {
    touch_counters();
    Block* chain = h->incoming.take_all();
    // 1. Count the chain's blocks per span of h. A block beyond its span's carved part was
    // never handed out (a bad free the owner reports when it drains): its span is pinned, so a
    // bogus count never releases a span under a live block.
    std::size_t taken_bytes = 0;
    for (Block* b = chain; b != nullptr; b = chain_next(b)) {
      auto a = reinterpret_cast<std::uintptr_t>(b);
      Span* s = chunk_of(a)->span_of(a);
      taken_bytes += s->block_size;
      if (s->owner.load(std::memory_order_acquire) != h) continue;
      SpanCount* e = find_slot(s, true);
      if (e == nullptr || e->count == kPinned) continue;
      e->count = s->in_carved_part(a) ? e->count + 1 : kPinned;
    }
    // 2. A span all of whose blocks are in the chain has no live block. Acquire: the owner's
    // last free into it (a release store of used) happens before its pages change hands.
    for (unsigned k = 0; k < g_spans.count; ++k) {
      SpanCount& e = g_spans.slots[g_spans.used[k]];
      Span* s = e.span;
      if (e.count == kPinned) continue;
      // An installed span is the owner's to allocate from without the lock (and to count in
      // `used` without an atomic): never touched here, not even read.
      if (s->kind == SpanKind::kSmall && h->installed[s->size_class] == s) continue;
      if (std::atomic_ref<std::uint32_t>(s->used).load(std::memory_order_acquire) != e.count) continue;
      // No live block, but the owner may still be on its way to free_local_refilled for the
      // free that just refilled a full span (its decrement done, the lock not yet taken): then
      // s has a free block but is not listed. Left for a later pass, since that call reads s.
      // (Any other span not installed is either listed, with free blocks, or full: the owner
      // writes free before its release decrement, so the read below sees that write.)
      if (s->free != nullptr && !s->listed) continue;
      e.count = kReleased;
    }
    // 2b. Installed spans with no live block, their queued blocks dropped with their pages.
    if (purge_installed) {
      PurgeCandidate candidates[kNumClasses];
      unsigned n = 0;
      for (unsigned c = 0; c < kNumClasses; ++c) {
        Span* s = h->installed[c];
        if (s == &g_empty_span || s->idle_purged) continue;
        SpanCount* e = find_slot(s, false);
        if (e != nullptr && e->count == kPinned) continue;
        std::uint32_t queued = e != nullptr ? e->count : 0;
        // A live block, or blocks on their way to h's queue: left alone.
        if (std::atomic_ref<std::uint32_t>(s->used).load(std::memory_order_acquire) != queued) continue;
        if (e == nullptr && (e = find_slot(s, true)) == nullptr) continue;  // no room: a later pass
        std::atomic_ref<Span*>(h->current[c]).store(&g_empty_span, std::memory_order_seq_cst);
        candidates[n++] = PurgeCandidate{s, e};
      }
      if (n != 0 && platform::barrier_all_threads()) {
        for (unsigned k = 0; k < n; ++k)
          if (purge_in_place_decide(h, candidates[k].span, candidates[k].entry->count)) candidates[k].entry->count = kPurged;
      }
    }
    // 3. The other blocks go back to the queue, in one push, before any page is given away:
    // a released span's blocks are not touched again. A block of a span h no longer owns (h
    // gave it to the central pool after the block was sent: the span keep, remote_free.cc) goes
    // on to the span's owner now, as h's drain would send it: h may stay blocked for good.
    Block* keep_head = nullptr;
    Block* keep_tail = nullptr;
    std::size_t keep_bytes = 0;
    for (Block* b = chain; b != nullptr;) {
      Block* next = chain_next(b);
      auto a = reinterpret_cast<std::uintptr_t>(b);
      Span* s = chunk_of(a)->span_of(a);
      if (Heap* owner = s->owner.load(std::memory_order_acquire); owner != h && owner != nullptr) {
        send_chain(owner, b, b, s->block_size);
        b = next;
        continue;
      }
      SpanCount* e = find_slot(s, false);
      if (e == nullptr || (e->count != kReleased && e->count != kPurged)) {
        set_link(b, keep_head);
        keep_head = b;
        if (keep_tail == nullptr) keep_tail = b;
        keep_bytes += s->block_size;
      }
      b = next;
    }
    note_chain_taken(taken_bytes);  // the statistics' bytes in queues
    if (keep_head != nullptr) send_chain(h, keep_head, keep_tail, keep_bytes);
    // 4. Give the spans back, as the owner would when their last block came home.
    for (unsigned k = 0; k < g_spans.count; ++k) {
      SpanCount& e = g_spans.slots[g_spans.used[k]];
      if (e.count == kPurged) (purged != nullptr ? *purged : bytes) += purge_in_place(e.span);
      if (e.count != kReleased) continue;
      Span* s = e.span;
      std::atomic_ref<std::uint32_t>(s->used).store(0, std::memory_order_relaxed);
      bytes += std::size_t{s->page_count} << kPageShift;
      heap_release_span(h, s);
    }
    clear_spans();
  }
  h->slow_lock.unlock();
  return bytes;
}

}  // namespace

std::size_t reclaim_queued_frees(Heap* h, std::size_t* purged) {
  LockGuard pass(g_pass_lock);
  return reclaim_locked(h, purged != nullptr, purged);
}

void reclaim_table_for_test(const void** start, std::size_t* bytes) {
  *start = &g_spans;
  *bytes = sizeof g_spans;
}

// Tried, not waited for: the caller holds its own heap's slow lock, and a pass or another
// claimer busy with the table is doing the same work.
std::size_t reclaim_other_queues(Heap* self) {
  if (!g_pass_lock.try_lock()) return 0;
  std::size_t bytes = 0;
  for (Heap* o = all_heaps(); o != nullptr; o = o->all_next)
    if (o != self && !o->incoming.empty()) bytes += reclaim_locked(o, false);
  g_pass_lock.unlock();
  return bytes;
}

std::uint64_t background_pass(std::uint64_t now) {
  auto delay = static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  auto idle = static_cast<std::uint64_t>(options::get(options::Id::kIdleMs));
  // Debug mode's quarantine first, so that the blocks it lets go reach their debug heaps' queues,
  // which the loop below reclaims for the idle ones. Outside the pass lock: debug/ takes its own
  // locks there (a shard's, a debug heap's live lock, the report sink's), and fork's prepare
  // takes those before the pass lock (heap_lifecycle.cc). Only once the debug layer is set up:
  // its init writes the hooks before that flag's release store, and a thread started before
  // main may run this pass while debug/'s constructor writes them.
  if (g_debug_blocks_may_exist.load(std::memory_order_acquire))
    if (auto idle_quarantine = g_debug_hooks.quarantine_idle) idle_quarantine(now, idle);
  // Heaps left attached by threads that are gone (heap_reap_exited), among those the last pass
  // saw idle, at most once per BRISK_IDLE_MS: one tgkill each. Outside the pass lock, as at
  // thread exit.
  if (now - g_last_reap_ms.load(std::memory_order_relaxed) >= idle) {
    g_last_reap_ms.store(now, std::memory_order_relaxed);
    heap_reap_exited(true);
  }
  // Heaps parked in pthread_join for BRISK_IDLE_MS (heap_lifecycle.cc, "Parked heaps"): what
  // they hold is taken, spans with live blocks to the central pools, the rest given back, as a
  // free of one of their blocks takes them sooner. Outside the pass lock, as at thread exit.
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) heap_take_parked(h, now, idle);
  LockGuard g(g_pass_lock);
  std::size_t bytes = 0;
  drain_orphans_tried();
  // A heap whose owner ran no slow path for BRISK_IDLE_MS is idle: its queue is reclaimed and
  // its chunks decay here. Busy heaps are left to their own purges: taking their queues and
  // purging their free pages behind their backs cost 20% on the producer/consumer and Larson
  // workloads in refaults and lock waits, for no memory a busy thread would not reuse.
  //
  // A thread's debug heap is watched on its own: a thread in debug mode runs its slow paths on
  // its debug heap while its thread heap looks idle, and a thread that left debug mode leaves
  // its debug heap idle while it runs. An idle debug heap gives back the frees queued to it (the
  // blocks other threads evicted from the quarantine) and its medium cache and spares.
  auto note_idle = [&](Heap* h) {
    std::uint32_t entries = h->slow_entries.load(std::memory_order_relaxed);
    if (entries != h->idle_seen_entries || h->idle_active_ms == 0) {
      h->idle_seen_entries = entries;
      h->idle_active_ms = now;
    }
    store_shared(h->idle, now - h->idle_active_ms >= idle);  // read by debug/ outside the lock
    return h->idle;
  };
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) {
    if (note_idle(h)) bytes += reclaim_locked(h, true) + heap_give_back_kept_tried(h);
    Heap* d = std::atomic_ref<Heap*>(h->debug).load(std::memory_order_acquire);
    if (d != nullptr && note_idle(d)) bytes += reclaim_locked(d, false) + heap_give_back_kept_tried(d);
  }
  // Kept empty spans past the purge delay go back to their chunks first, whose decay below (or
  // their heaps' own purge checks) then gives their pages back.
  release_kept_spans(now, delay);  // not counted here: the pages are not the OS's yet
  chunk_destroy_empty_abandoned();
  bool pending = true;
  if (now - g_last_decay_ms >= delay) {
    // The free pages among live blocks in orphan spans (exited threads' spans, and spans busy
    // threads shed), once nothing came back to them for a purge delay: no thread's lock-free
    // path uses an orphan, and the next thread short of the class faults them in again.
    bytes += punch_orphan_holes(now, delay);
    // Chunks of idle heaps and abandoned chunks (no page owner) only.
    bytes += chunk_decay_all(&pending, options::get(options::Id::kPurgeAdvice) == 1,
                             [](const Heap* owner) { return owner == nullptr || owner->idle; });
    bytes += large_cache_decay(now, &pending);
    g_last_decay_ms = now;
  }
  pending = pending || CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) != 0;
  g_bytes_returned.fetch_add(bytes, std::memory_order_relaxed);
  if (pending || bytes != 0) {
    g_backoff_ms = kMinSleepMs;
    return delay > kMinSleepMs ? delay : kMinSleepMs;
  }
  std::uint64_t sleep = g_backoff_ms;
  g_backoff_ms = sleep * 2 < idle ? sleep * 2 : idle;
  return sleep;
}

}  // namespace brisk
