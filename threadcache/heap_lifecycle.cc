// Thread and process lifecycle: process initialisation, the heap of each thread (created on
// first use, recycled after its thread exits), thread exit, and fork.
//
// Thread exit: the heap flushes its outgoing batches, closes its remote queue and takes what
// was queued, then hands every span still holding live blocks to the central pool of its class
// (owner = the orphan heap), releases empty spans, and abandons its chunks for other heaps to
// adopt. A block freed later by any thread reaches the orphan queue and is put back under the
// central pool's lock: it is reclaimed, not leaked and not crashed on.
//
// After its heap is detached the thread never owns a heap again (t_heap = &g_exited_heap): no
// destructor round is left to give one back. Its frees go to the owner's queue, and each of its
// allocations borrows a heap from the pool and gives it back detached (heap_borrow).
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <new>

#include "core/central_pool.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/platform_fork.h"
#include "core/stats.h"
#include "threadcache/heap.h"
#include "threadcache/background.h"
#include "threadcache/debug_switch.h"
#include "threadcache/foreign_cache.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {

constinit Heap g_sentinel_heap{&g_empty_span};
constinit Heap g_orphan_heap{&g_empty_span};
constinit Heap g_exited_heap{&g_empty_span};
__thread Heap* t_heap __attribute__((tls_model("initial-exec"))) = &g_sentinel_heap;

namespace {

__thread bool t_in_init __attribute__((tls_model("initial-exec"))) = false;

std::atomic<int> g_init_state{0};  // 0: not started, 1: running, 2: done
// The process brisk was set up in, or forked into with its handlers (atfork_child). Another pid
// means a vfork child, which shares the parent's memory (or a child of _Fork, which runs no
// handlers): no background thread is started there (heap_for_this_thread).
std::atomic<std::uint32_t> g_process_pid{0};
pthread_key_t g_thread_key;

// Heap objects come from brisk's own metadata slabs, never from malloc, and are recycled: a
// heap's address stays valid for the process's lifetime, so a late remote free can always push
// to the queue of a heap whose thread has gone (the push finds the queue closed).
SpinLock g_pool_lock;
Heap* g_pool_head = nullptr;
char* g_slab_cursor = nullptr;
char* g_slab_end = nullptr;
std::uint32_t g_next_heap_id = 1;
// Every heap ever made, newest first; pushed under g_pool_lock, read without it (a heap is
// never unlinked nor unmapped, and its links are written before it is published).
std::atomic<Heap*> g_all_heaps{nullptr};
constexpr std::size_t kSlabBytes = 256 * 1024;

// Heaps given to threads since the last sweep for the heaps of threads gone without their key
// destructor (heap_reap_exited), and how many heap_for_this_thread may give before it sweeps.
constexpr std::uint32_t kReapAfterMin = 8;
std::atomic<std::uint32_t> g_attached_since_reap{0};
std::atomic<std::uint32_t> g_reap_after{kReapAfterMin};

// thread_id: the OS id of the thread the heap is for, 0 for a borrowed heap; pid: its process's.
// Stored under the pool lock, so that heap_reap_exited, which checks and clears them under that
// lock, can never clear the id of a heap that a new thread has just taken from the pool.
Heap* heap_acquire(std::uint64_t thread_id, std::uint32_t pid = 0) {
  LockGuard g(g_pool_lock);
  Heap* h = g_pool_head;
  if (h != nullptr) {
    g_pool_head = h->pool_next;
  } else {
    constexpr std::size_t size = (sizeof(Heap) + BRISK_CACHELINE - 1) & ~std::size_t{BRISK_CACHELINE - 1};
    if (g_slab_cursor == nullptr || g_slab_end - g_slab_cursor < static_cast<std::ptrdiff_t>(size)) {
      auto* slab = static_cast<char*>(platform::map(kSlabBytes));
      if (slab == nullptr) return nullptr;
      g_slab_cursor = slab;
      g_slab_end = slab + kSlabBytes;
    }
    h = new (g_slab_cursor) Heap(&g_empty_span);
    g_slab_cursor += size;
    h->id = g_next_heap_id++;
    h->all_next = g_all_heaps.load(std::memory_order_relaxed);
    g_all_heaps.store(h, std::memory_order_release);
    stats::add(stats::g.heaps_total, 1);
  }
  h->thread_id.store(thread_id, std::memory_order_relaxed);
  h->thread_pid.store(pid, std::memory_order_relaxed);
  // Counted for the thread the heap is given to; a take of its heap while it waits in
  // pthread_join resets the heap (heap_reset), not them.
  h->remote_frees_sent.store(0, std::memory_order_relaxed);
  h->remote_frees_received.store(0, std::memory_order_relaxed);
  // Running: a heap whose thread left while parked without unparking (heap_reap_exited clears
  // the mark too) must not be taken under its next thread.
  h->parked.store(kHeapRunning, std::memory_order_relaxed);
  if (thread_id != 0) g_attached_since_reap.fetch_add(1, std::memory_order_relaxed);
  return h;
}

void heap_pool_push(Heap* h) {
  LockGuard g(g_pool_lock);
  h->pool_next = g_pool_head;
  g_pool_head = h;
}

void heap_reset(Heap* h) {
  HeapSlowLock lock(h);
  for (unsigned c = 0; c < kNumClasses; ++c) set_current(h, c, &g_empty_span);
  for (auto& l : h->available) l = SpanList{};
  h->all_spans = nullptr;
  store_shared(h->span_count, 0u);
  h->chunks = nullptr;
  for (auto& o : h->outgoing) {
    o.dest = nullptr;
    o.head = o.tail = nullptr;
    store_shared(o.count, 0u);  // read by the statistics (heap.h)
    store_shared(o.bytes, std::size_t{0});
  }
  h->released_since_purge = 0;
  h->aged_at_ms = 0;
  h->refills = 0;
  for (auto& r : h->refilled_at) r = 0;
  for (auto& t : h->kept_taken_at) t = 0;
  h->take_kept_after = Heap::kTakeKeptAfterMin;
  h->lever_epoch = ~std::uint32_t{0};
  for (auto& r : h->retained) r = false;
  for (auto& s : h->spare) s = nullptr;
  for (auto& r : h->recent_releases) r = Heap::RecentRelease{};
  h->recent_next = 0;
  BRISK_ASSERT(h->pending_tail_count == 0);  // flushed or dropped at detach, and nothing carves after it
  h->pending_tail_count = 0;
  h->retained_count = 0;
  h->retained_next = 0;
  for (auto& s : h->medium_cache) s = nullptr;
  h->medium_cache_count = 0;
  h->medium_cache_bytes = 0;
  // The foreign cache went home at detach; which classes the last thread allocated says
  // nothing about this one.
  for (Block* f : h->foreign) BRISK_ASSERT(f == nullptr);
  for (bool& wanted : h->foreign_wanted) wanted = false;
  h->pool_next = nullptr;
  h->incoming.reopen();
  h->serving = true;
}

void heap_detach(Heap* h) {
  HeapSlowLock lock(h);
  h->serving = false;
  // Pending span tails go back here only at BRISK_PURGE_SPAN_TAILS=2 (low-memory), before the
  // spans are released or orphaned, which drops them. Otherwise they stay with their spans: the
  // next thread short of the class takes an orphan and carves on into its tail, and a thread
  // whose exit gave those pages back made that thread fault them in again (options.cc).
  if (options::get(options::Id::kPurgeSpanTails) >= 2) heap_flush_span_tails(h);
  h->pending_tail_count = 0;
  foreign_cache_flush(h);
  heap_flush_outgoing(h);
  // From here on, pushes to h fail and go to the orphan queue.
  Block* b = h->incoming.close();
  for (unsigned c = 0; c < kNumClasses; ++c) set_current(h, c, &g_empty_span);
  heap_process_blocks(h, b);
  medium_cache_flush(h);
  // Take spans from the head each time: releasing one unlinks it, and an orphaned span must
  // leave the list before another heap can adopt it.
  while (Span* s = h->all_spans) {
    if (s->listed) h->available[s->size_class].remove(s);
    if (s->used == 0) {
      if (s->kind != SpanKind::kSmall || !heap_keep_empty_span(h, s)) heap_release_span(h, s);
    } else {
      heap_unlink_span(h, s);
      orphan_span(s);
    }
  }
  h->all_spans = nullptr;
  store_shared(h->span_count, 0u);
  for (Chunk* c = h->chunks; c != nullptr;) {
    Chunk* next = c->next;
    chunk_abandon(c);
    c = next;
  }
  h->chunks = nullptr;
  drain_orphans();
}

// A thread heap's debug heap is not detached with it (debug_switch.h): it goes to the pool with
// the heap, still owning its spans. It takes what other threads sent it and gives back the
// spans that emptied and its cached medium runs, so a debug heap parked in the pool holds no
// freed block it could return (the blocks in its quarantine batch, debug/debug_heap.h, wait for
// the heap's next thread).
void park_debug_heap(Heap* h) {
  Heap* d = h->debug;
  if (d == nullptr) return;
  HeapSlowLock lock(d);  // brisk_trim may reclaim its queue meanwhile (reclaim_queued_frees)
  heap_drain_incoming(d);
  heap_release_empty_spans(d);
  medium_cache_flush(d);
  heap_flush_span_tails(d);
}

// A heap whose thread is gone, or is going and will not use it again, to the pool: detached
// as at thread exit. Its thread_id is 0 already.
void heap_retire(Heap* h) {
  heap_detach(h);
  park_debug_heap(h);
  // The last heap: the background thread ends once it is the process's only thread.
  if (stats::g.heaps_live.fetch_sub(1, std::memory_order_acq_rel) == 1) background_heaps_gone();
  heap_pool_push(h);
}

// Parked heaps. Blocks that other threads free go home to the heap that owns their span, and
// wait in its queue until its thread runs a slow path; a thread blocked in pthread_join runs
// none. The classic case is a program's main thread: it allocates the input, starts workers
// that free it as they go, and joins them. The freed blocks then wait in the main thread's
// queue, and their spans, partly free, stay the main thread's, while the workers take fresh
// memory for their own blocks (larson-classic: 21-29 MiB queued at the peak, sampled every 20
// ms, against 27 MiB live). The idle reclaim (background.cc) gives back only spans all of whose
// blocks are queued, since the owner's fast paths use its spans without a lock.
//
// A thread about to wait in pthread_join (override/threads.cc) parks its heap: t_heap becomes
// g_exited_heap, so that nothing the thread does until it unparks (a signal handler's malloc)
// touches the heap, and the heap is marked kHeapParked with a release store, after every write
// the thread made to it and its spans. Then the heap is like that of an exited thread, except
// that its thread will come back: another thread (a free of one of its blocks, free_slow; the
// background pass) may take its slow lock with try_lock, see the mark still there (acquire),
// and detach the heap as at thread exit, acting for its thread: its queue is processed, its
// spans with live blocks go to the central pools, where the threads freeing those blocks adopt
// them whole (orphans.cc), its empty spans and caches go back, its chunks are abandoned to be
// adopted. The heap is then reset, serving and empty, still its thread's, and marked taken.
// Unparking clears the mark and then takes and drops the slow lock: a take that holds the lock
// finishes first; one that takes it later sees the mark cleared (the lock orders the two).
// Only then does t_heap point at the heap again, so the thread's fast paths never run beside a
// take. Signals are held off meanwhile: a handler that forked while this thread held the lock
// would wait for it in fork's prepare handler, which takes the parked heap's lock as the
// forking thread's own (waiting for a take under way), so that the child, which keeps the
// parked heap, finds it free when its join returns. A block that reaches the heap's queue after
// the take, sent by a thread that had read the old owner, is forwarded to its span's present
// owner (process_owned_run).
//
// A heap is taken only after kParkedTakeAfterMs parked: a join that returns at once costs
// nothing but the marks. A take costs about what its thread's exit would, in the free that
// makes it: O(spans), about 0.15-0.2 us each (a review measured 0.5 ms for 200 MiB of 1 KiB
// blocks), so a free takes a heap of at most kParkedTakeInFreeMaxSpans spans; a bigger one is
// left to the background pass. A thread that leaves pthread_join without returning
// (cancelled, or pthread_exit from a signal handler) still runs its key destructor, which
// unparks first; one that leaves by the exit system call has its heap reaped
// (heap_reap_exited), which clears the mark under the heap's lock, and heap_acquire clears it
// for every heap given to a new thread.
__thread Heap* t_parked __attribute__((tls_model("initial-exec"))) = nullptr;
std::atomic<std::uint64_t> g_taken_parked{0};

}  // namespace

std::atomic<void (*)(Heap* h)> g_take_parked_test_hook{nullptr};

Heap* heap_park() {
  Heap* h = t_heap;
  // Not from a signal handler that interrupted one of this thread's slow paths (its unpark
  // would wait for the lock the thread holds).
  if (!heap_is_attached(h) || t_parked != nullptr || h->slow_depth != 0) return nullptr;
  t_parked = h;
  t_heap = &g_exited_heap;
  h->parked_at_ms.store(platform::now_ms(), std::memory_order_relaxed);
  h->parked.store(kHeapParked, std::memory_order_release);
  return h;
}

void heap_unpark(Heap* h) {
  if (h == nullptr || t_parked != h) return;
  // Signals blocked while this thread holds the slow lock: a handler that forked there would
  // wait in atfork_prepare for the lock this thread holds (prepare takes t_parked's lock).
  sigset_t saved;
  platform::block_signals(&saved);
  h->parked.store(kHeapRunning, std::memory_order_relaxed);
  // A take under way holds the lock: wait for it. One after this sees the mark cleared.
  h->slow_lock.lock();
  h->slow_lock.unlock();
  t_parked = nullptr;
  t_heap = h;
  platform::restore_signals(&saved);
}

bool heap_take_parked(Heap* o, std::uint64_t now, std::uint64_t after_ms) {
  // The mark first (acquire), then the time it was parked at, stored before it.
  if (o->parked.load(std::memory_order_acquire) != kHeapParked ||
      now < o->parked_at_ms.load(std::memory_order_relaxed) + after_ms)
    return false;
  if (!o->slow_lock.try_lock()) return false;
  // Under the lock: unparking clears the mark before it waits for the lock. The time again: the
  // mark read above may have been of an earlier park.
  if (o->parked.load(std::memory_order_acquire) != kHeapParked || !o->serving ||
      now < o->parked_at_ms.load(std::memory_order_relaxed) + after_ms) {
    o->slow_lock.unlock();
    return false;
  }
  // For o's thread, which is waiting: heap_detach's and heap_reset's HeapSlowLocks nest in
  // this one, as its own slow paths' do (slow_depth is 0 while its thread is parked).
  BRISK_ASSERT(o->slow_depth == 0);
  o->slow_depth = 1;
  o->slow_entries.store(o->slow_entries.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (o->idle_purged) heap_rebuild_idle_purged(o);
  heap_detach(o);
  heap_reset(o);
  // Unless its thread, back from its join, has cleared the mark meanwhile (it waits for the lock).
  std::uint8_t parked = kHeapParked;
  o->parked.compare_exchange_strong(parked, kHeapParkedTaken, std::memory_order_relaxed);
  if (auto hook = g_take_parked_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook(o);
  o->slow_depth = 0;
  o->slow_lock.unlock();
  g_taken_parked.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t heaps_taken_parked() { return g_taken_parked.load(std::memory_order_relaxed); }

namespace {

void on_thread_exit(void* value) {
  auto* h = static_cast<Heap*>(value);
  // A thread that left pthread_join without returning from it (cancelled) is still parked.
  if (h != nullptr && h == t_parked) heap_unpark(h);
  // glibc reuses the thread descriptor of a thread that left by the exit system call without
  // clearing its key values: a thread that never allocated may find that thread's heap here,
  // given back since (heap_reap_exited) and maybe another thread's now. Only t_heap (initial-exec
  // TLS, set afresh for each thread) says which heap is this thread's.
  if (h == nullptr || h != t_heap) return;
  // Destructors of other keys, and glibc's __libc_thread_freeres after all of them, may still
  // allocate and free on this thread; a heap attached now would never be detached again.
  t_heap = &g_exited_heap;
  h->thread_id.store(0, std::memory_order_relaxed);
  heap_retire(h);
}

// fork: the child gets a copy of every lock in whatever state another thread left it. Prepare
// takes them all (in one fixed order) and the parent and child handlers release them, so the
// child can allocate at once.
//
// Lock order: the C library's stdio list lock first, then brisk's. glibc's fork takes
// _IO_list_lock itself only after the prepare handlers, and stdio calls malloc under its locks
// (getline reallocs inside flockfile; fflush(NULL) holds the list lock while it waits for each
// stream; exit frees buffers under it). Had prepare taken brisk's locks alone, the forking
// thread would hold them while waiting for the list lock, held by fflush(NULL), which waits for
// a stream held by getline, which waits for a brisk lock: a cycle. The list lock is recursive,
// so fork's own acquisition then only counts up; glibc's malloc keeps the same order.
//
// A single-threaded process (glibc's own test, read the same way) takes no lock: no other
// thread can hold one, only code this thread interrupted to run a signal handler that forks,
// and waiting for that would never end. glibc's malloc does the same; such a child may only make
// async-signal-safe calls.
//
// Signals stay blocked from prepare until the parent or child handler: a handler that forked on
// this thread while it holds brisk's locks would spin on them forever (a nested fork); blocked,
// it runs once fork has returned.
struct ForkState {
  bool locked;        // prepare took brisk's locks
  bool stdio_locked;  // ... and before them the stdio list lock
  bool check_locked;  // ... and before that the debug layer's heap-check lock
  Heap* own;          // the forking thread's heap, whose slow lock prepare took
  Heap* own_debug;    // ... and its debug heap, if it has one, whose slow lock prepare took too
  sigset_t saved_mask;
};
__thread ForkState t_fork __attribute__((tls_model("initial-exec")));

void atfork_prepare() {
  ForkState& f = t_fork;
  platform::block_signals(&f.saved_mask);
  f.locked = !platform::single_threaded();
  if (!f.locked) return;
  // The heap check's lock before the stdio list lock: a report callback, run under it, may take
  // that lock (fopen, fflush) or fork; had prepare taken stdio's first, another thread's fork
  // and such a callback waited for each other (a review's probe).
  f.check_locked = g_debug_hooks.fork_check_lock != nullptr;
  if (f.check_locked) g_debug_hooks.fork_check_lock();
  f.stdio_locked = platform::stdio_list_lock();
  // The debug layer's locks before the thread cache's: debug/ takes none of its own while it
  // holds a lower one, and a report callback run under its heap-check lock may allocate.
  if (g_debug_hooks.fork_prepare != nullptr) g_debug_hooks.fork_prepare();
  g_pool_lock.lock();
  background_locks_acquire();
  // Another thread may hold this heap's slow lock: a remote free of a medium block releases its
  // pages under it (free_remote_medium). The child's first slow path would wait for it for ever,
  // so wait for it here. Other heaps' slow locks need not be taken: in the child only
  // try_lock reaches them (their owners are gone), except pooled heaps', reset below. The
  // order (debug, pool and pass locks, then this) cannot deadlock: whoever else holds a
  // heap's slow lock without owning the heap took it with try_lock and waits on no lock of
  // prepare's but the central pools' (a span kept whole, orphans.h) and leaf chunk locks,
  // taken after it here.
  // A thread parked in pthread_join (forking from a signal handler) owns its parked heap: a
  // take under way holds that lock and waits on no lock of prepare's but those taken after it
  // here (central, chunk, large); the child's thread goes back into its join and unparks.
  f.own = heap_is_attached(t_heap) ? t_heap : t_parked;
  if (f.own != nullptr) f.own->slow_lock.lock();
  // Its debug heap's too: brisk_trim and the background pass take it with try_lock (an idle
  // debug heap's queue and medium runs), and the child's first debug slow path waits for it.
  f.own_debug = f.own != nullptr ? f.own->debug : nullptr;
  if (f.own_debug != nullptr) f.own_debug->slow_lock.lock();
  orphan_drain_lock_acquire();  // a drainer holds it over central pool locks
  central_locks_acquire();
  kept_releases_wait();  // started under a central pool's lock, they take chunk locks
  chunk_locks_acquire();
  large_locks_acquire();
}
void atfork_parent() {
  ForkState& f = t_fork;
  if (f.locked) {
    large_locks_release();
    chunk_locks_release();
    central_locks_release();
    orphan_drain_lock_release();
    if (f.own_debug != nullptr) f.own_debug->slow_lock.unlock();
    if (f.own != nullptr) f.own->slow_lock.unlock();
    background_locks_release();
    g_pool_lock.unlock();
    if (g_debug_hooks.fork_parent != nullptr) g_debug_hooks.fork_parent();
    if (f.stdio_locked) platform::stdio_list_unlock();
    if (f.check_locked) g_debug_hooks.fork_check_unlock();
  }
  f.locked = f.stdio_locked = f.check_locked = false;
  platform::restore_signals(&f.saved_mask);
}
void atfork_child() {
  ForkState& f = t_fork;
  if (f.locked) {
    large_locks_reset_in_child();
    chunk_locks_reset_in_child();
    central_locks_reset_in_child();
    orphan_drain_lock_reset_in_child();
    kept_releases_reset_in_child();
    if (f.own_debug != nullptr) f.own_debug->slow_lock.unlock();
    if (f.own != nullptr) f.own->slow_lock.unlock();
    // A pooled heap's slow lock is held only by a try_lock that reads `serving`
    // (free_remote_medium, heap_give_back_kept_tried), whose thread is gone; its debug heap's,
    // only by brisk_trim's and the background pass's try_lock.
    for (Heap* p = g_pool_head; p != nullptr; p = p->pool_next) {
      p->slow_lock.reset_after_fork();
      if (p->debug != nullptr) p->debug->slow_lock.reset_after_fork();
    }
    background_locks_reset_in_child();
    g_pool_lock.reset_after_fork();
    if (g_debug_hooks.fork_child != nullptr) g_debug_hooks.fork_child();
    if (f.stdio_locked) platform::stdio_list_reset_in_child();
    if (f.check_locked) g_debug_hooks.fork_check_reset();
  }
  f.locked = f.stdio_locked = f.check_locked = false;
  // A switch of strategy, or a lever resolution racing one, may have been cut short by the
  // fork: the child re-resolves every lever (core/options.cc's get_slow).
  options::drop_kept_values();
  stats::g.heaps_live.store(heap_is_attached(t_heap) || t_parked != nullptr ? 1 : 0, std::memory_order_relaxed);
  g_process_pid.store(platform::current_process_id(), std::memory_order_relaxed);
  background_reset_in_child();
  // The other threads are gone; their heaps stay as they were, attached to no thread. A thread
  // that forked while parked keeps its parked heap: it unparks when its join returns.
  for (Heap* h = g_all_heaps.load(std::memory_order_acquire); h != nullptr; h = h->all_next) {
    if (h == t_heap || h == t_parked) {
      h->thread_id.store(platform::current_thread_id(), std::memory_order_relaxed);
      h->thread_pid.store(platform::current_process_id(), std::memory_order_relaxed);
    } else {
      h->thread_id.store(0, std::memory_order_relaxed);
    }
  }
  platform::restore_signals(&f.saved_mask);
}

}  // namespace

LockCounts heap_pool_lock_counts() { return g_pool_lock.counts(); }

void process_init() {
  if (BRISK_LIKELY(g_init_state.load(std::memory_order_acquire) == 2)) return;
  int expected = 0;
  if (g_init_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    t_in_init = true;
    // The offset's top bit and the odd multiplier keep a free key from ever being 0, a live
    // block's key word; the multiplier's top bit keeps neighbouring blocks' link masks apart
    // (core/free_key.h).
    g_free_secret.offset = platform::random_u64() | (std::uint64_t{1} << 63);
    g_free_secret.multiplier = platform::random_u64() | 1 | (std::uint64_t{1} << 63);
    pthread_key_create(&g_thread_key, on_thread_exit);
    g_process_pid.store(platform::current_process_id(), std::memory_order_relaxed);
    platform::register_fork_handlers(atfork_prepare, atfork_parent, atfork_child);
    g_init_state.store(2, std::memory_order_release);
    t_in_init = false;
    return;
  }
  if (t_in_init) return;  // a libc call inside initialisation came back to malloc
  while (g_init_state.load(std::memory_order_acquire) != 2) sched_yield();
}

Heap* all_heaps() { return g_all_heaps.load(std::memory_order_acquire); }

void debug_point_heaps_at_empty_span() {
  for (Heap* h = g_all_heaps.load(std::memory_order_acquire); h != nullptr; h = h->all_next)
    for (auto& s : h->current) std::atomic_ref<Span*>(s).store(&g_empty_span, std::memory_order_relaxed);
}

Heap* heap_borrow() {
  Heap* h = heap_acquire(0);
  if (h != nullptr) heap_reset(h);
  return h;
}

void heap_give_back(Heap* h) {
  heap_detach(h);
  park_debug_heap(h);
  heap_pool_push(h);
}

// Sweeps for heaps whose threads are gone (heap_reap_exited) each time it has given out as many
// heaps since the last sweep as were attached after it (at least kReapAfterMin): threads that
// keep leaving heaps behind leave at most that many at a time, and the sweeps cost O(1)
// thread_gone calls per thread started, however many run.
Heap* heap_for_this_thread() {
  process_init();
  if (t_heap != &g_sentinel_heap) return t_heap;
  if (g_attached_since_reap.load(std::memory_order_relaxed) >= g_reap_after.load(std::memory_order_relaxed))
    heap_reap_exited();
  const std::uint64_t tid = platform::current_thread_id();
  const std::uint32_t pid = platform::current_process_id();
  Heap* h = heap_acquire(tid, pid);
  if (h == nullptr) return nullptr;
  heap_reset(h);
  t_heap = h;  // before pthread_setspecific, which may itself call calloc
  stats::add(stats::g.heaps_live, 1);
  if (g_init_state.load(std::memory_order_acquire) == 2) pthread_setspecific(g_thread_key, h);
  // A second thread allocating: the process is multithreaded now, and may want the background
  // thread (which needs a heap of its own no more than any pthread_create does). Not from a
  // vfork child: the thread would die with the child, perhaps holding the parent's locks, and
  // its start would mark the parent's thread started.
  if (pid == g_process_pid.load(std::memory_order_relaxed)) background_maybe_start();
  return h;
}

// A thread gets its heap at its first allocation and gives it back from its key destructor
// (on_thread_exit). A thread whose first allocation comes in glibc's last round of key
// destructors (PTHREAD_DESTRUCTOR_ITERATIONS: a destructor that re-arms its key, then
// allocates) sets the key when no round is left to run it, and a thread that leaves by a raw
// exit system call runs none: either leaves its heap attached, with its spans, chunks and
// queue, for good. Such a heap is found by its thread_id: the thread is gone (tgkill finds no
// such thread). Nothing of that thread can touch the heap again, so whoever claims it may
// detach it as the thread would have. Claimed under the pool lock, the id checked again there:
// a heap whose thread exited normally is back in the pool with id 0, and one a new thread has
// taken since carries that thread's id (heap_acquire writes it under the lock), so the claim
// fails unless the id is still that of a thread that is gone. An id the kernel has reused for a
// new thread makes the heap look attached: it is found at a later sweep, once that thread is
// gone too.
//
// Under ThreadSanitizer the dead thread's last fast-path writes to the heap happen before the
// claim only through the kernel (the thread's exit); a caller that joined the thread has that
// order, any other is reported as a race it is not.
std::size_t heap_reap_exited(bool only_idle) {
  std::size_t reaped = 0;
  // Heaps given out during the sweep count towards the next. Two threads may sweep at once: each
  // claim is taken by one of them.
  if (!only_idle) g_attached_since_reap.store(0, std::memory_order_relaxed);
  const std::uint32_t pid = platform::current_process_id();
  for (Heap* h = g_all_heaps.load(std::memory_order_acquire); h != nullptr; h = h->all_next) {
    const std::uint64_t tid = h->thread_id.load(std::memory_order_relaxed);
    if (tid == 0 || h == t_heap) continue;  // the caller's own heap is the only one with its id
    // An id read in another process names no thread of this one: a heap this process's thread
    // took in a vfork child (sharing its memory), or this thread's own in a child of _Fork.
    if (h->thread_pid.load(std::memory_order_relaxed) != pid) continue;
    if (only_idle && !load_shared(h->idle)) continue;
    if (!platform::thread_gone(pid, tid)) continue;
    {
      LockGuard g(g_pool_lock);
      if (h->thread_id.load(std::memory_order_relaxed) != tid || h->thread_pid.load(std::memory_order_relaxed) != pid ||
          !platform::thread_gone(pid, tid))
        continue;
      // A thread that left by the exit system call from a signal handler that had interrupted
      // one of its slow paths left the slow lock held: heap_detach would wait for it for ever.
      // Such a heap is left alone; one whose lock another thread holds for a moment (a
      // reclaim's try_lock) is taken at a later sweep.
      if (!h->slow_lock.try_lock()) continue;
      // A thread gone while parked in pthread_join (by the exit system call from a signal
      // handler): the mark goes under the lock, so no take is under way or can start, and
      // heap_detach below takes the lock as the heap's only user.
      h->parked.store(kHeapRunning, std::memory_order_relaxed);
      h->slow_lock.unlock();
      h->thread_id.store(0, std::memory_order_relaxed);
    }
    heap_retire(h);
    ++reaped;
  }
  if (!only_idle) {
    const auto live = static_cast<std::uint32_t>(stats::g.heaps_live.load(std::memory_order_relaxed));
    g_reap_after.store(live > kReapAfterMin ? live : kReapAfterMin, std::memory_order_relaxed);
  }
  return reaped;
}

__attribute__((constructor)) static void brisk_init_at_load() { process_init(); }

}  // namespace brisk
