// Emptying the quarantine before newer frees push its blocks out: brisk_trim takes every block
// out (flush_quarantine), the background pass the blocks of shards that threads stopped pushing
// to (leave_idle_quarantine). Without it a thread that stops freeing keeps its shard's last
// blocks for good, and they keep the spans they lie in. Each block leaves as one pushed out
// does (block.cc's leave_quarantine: checked, reported if damaged, freed).
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/hints.h"
#include "core/span.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "debug/quarantine.h"
#include "threadcache/heap.h"
#include "threadcache/remote_free.h"

namespace brisk::debug {

namespace {

// Takes up to `limit` blocks out of the quarantine with take(out, cap), at most kEvictBatch a
// call, until a call comes back short: each is checked and freed as a block pushed out is
// (leave_quarantine). Returns how many.
template <class Take>
std::size_t leave_each(Take take, std::size_t limit = ~std::size_t{0}) {
  QuarantinedBlock out[kEvictBatch];
  std::size_t total = 0;
  while (total < limit) {
    const std::size_t want = limit - total < kEvictBatch ? limit - total : kEvictBatch;
    const std::size_t n = take(out, want);
    leave_quarantine_all(out, n);
    total += n;
    if (n < want) break;
  }
  return total;
}

// d's batch of freed blocks on their way to the quarantine (DebugHeap::freed), taken out.
std::size_t take_freed_batch(DebugHeap* d, QuarantinedBlock* out) {
  LiveLock g(d);
  return d->take_freed(out);
}

// Sends what the calling thread's remote frees put in its outgoing batches (the underlying
// blocks of other debug heaps, freed above), so that their heaps' queues hold them for the
// reclaims that follow. A thread without a heap sent each one to its queue already.
void send_outgoing() {
  Heap* h = t_heap;
  if (!heap_is_attached(h)) return;
  HeapSlowLock lock(h);
  heap_flush_outgoing(h);
}

}  // namespace

std::atomic<void (*)()> g_idle_quarantine_test_hook{nullptr};

std::size_t flush_quarantine() {
  if (g_init_state.load(std::memory_order_acquire) != 2) return 0;
  std::size_t n = 0;
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    QuarantinedBlock batch[DebugHeap::kFreedBatch];
    const std::size_t taken = take_freed_batch(d, batch);
    leave_quarantine_all(batch, taken);
    n += taken;
  }
  // What each shard holds now, not what threads that go on freeing push meanwhile: the trim ends.
  for (unsigned i = 0; i < Quarantine::kShards; ++i)
    n += leave_each([i](QuarantinedBlock* out, std::size_t cap) { return g_quarantine.drain_shard(i, out, cap); },
                    g_quarantine.shard_count(i));
  send_outgoing();
  return n;
}

std::size_t leave_idle_quarantine(std::uint64_t now_ms, std::uint64_t idle_ms) {
  if (g_init_state.load(std::memory_order_acquire) != 2) return 0;
  if (auto hook = g_idle_quarantine_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook();
  // The batch of a debug heap whose owner is idle (the background pass's flag) may wait for a
  // free of one more of its blocks for ever: it joins the quarantine through this thread's
  // shard, and waits there like any block freed now.
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    if (!load_shared(d->idle)) continue;
    static_assert(DebugHeap::kFreedBatch < kEvictBatch);  // push_to_quarantine's room for a batch
    QuarantinedBlock batch[DebugHeap::kFreedBatch];
    if (const std::size_t n = take_freed_batch(d, batch)) push_to_quarantine(batch, n);
  }
  const std::size_t n = leave_each([now_ms, idle_ms](QuarantinedBlock* out, std::size_t cap) {
    return g_quarantine.take_idle(out, cap, now_ms, idle_ms);
  });
  send_outgoing();
  return n;
}

}  // namespace brisk::debug
