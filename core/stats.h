// Process-wide counters. Updated only on slow paths (never on the per-allocation fast path),
// with relaxed atomics; read by brisk_get_stats(), which adds what it derives from span state
// (threadcache/heap_stats.cc).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/hints.h"

namespace brisk::stats {

// Counters written at most once per chunk, per thread or per system call, side by side.
struct Counters {
  std::atomic<std::uint64_t> chunks_mapped{0};
  std::atomic<std::uint64_t> chunks_cached{0};
  std::atomic<std::uint64_t> os_map_calls{0};
  std::atomic<std::uint64_t> os_unmap_calls{0};
  std::atomic<std::uint64_t> os_decommit_calls{0};
  std::atomic<std::uint64_t> os_resident_calls{0};  // residency queries: mincore, or a read of pagemap (zero_pages)
  std::atomic<std::uint64_t> os_populate_calls{0};  // successful platform::populate calls (pages made present ahead of a write)
  std::atomic<std::uint64_t> heaps_live{0};
  std::atomic<std::uint64_t> heaps_total{0};
};

extern Counters g;

inline void add(std::atomic<std::uint64_t>& c, std::int64_t d) {
  c.fetch_add(static_cast<std::uint64_t>(d), std::memory_order_relaxed);
}

// A counter with one writer at a time (a heap's, written by its owner): a load and a store,
// without the locked instruction of add().
inline void add_single_writer(std::atomic<std::uint64_t>& c, std::int64_t d) {
  c.store(c.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(d), std::memory_order_relaxed);
}

// Counters written per remote batch, per large block or per span: striped counters (the idea
// of Java's LongAdder and Linux's percpu_counter). Each thread adds to its own stripe, a line
// of its own while no more than kStripes threads write, and a reader sums the stripes, so 64
// threads sending batches or freeing large blocks do not pass one line between their cores.
// Stripes rather than counters in each heap: large.cc, in core, has no heap; a remote batch is
// added by its sender and subtracted by its receiver; and a thread's counts stay in its stripe
// when it exits, with nothing to fold in. A stripe's own value means nothing (a block counted
// in one stripe may be uncounted from another, which then wraps below zero); only the sum does.
struct alignas(BRISK_CACHELINE) Stripe {
  std::atomic<std::uint64_t> large_bytes_mapped{0};
  std::atomic<std::uint64_t> large_bytes_cached{0};  // mirrors large.cc's g_cache_bytes
  std::atomic<std::uint64_t> large_live_blocks{0};
  std::atomic<std::uint64_t> large_bytes_in_use{0};  // usable bytes of live large blocks
  std::atomic<std::uint64_t> spans_orphaned{0};
  // Bytes of remote frees inside RemoteQueues (the orphan queue included): added before a chain
  // is pushed, subtracted once per chain taken.
  std::atomic<std::uint64_t> remote_queued_bytes{0};
};
static_assert(sizeof(Stripe) == BRISK_CACHELINE, "a stripe is one line");

// As many as the cores the README's scaling table argues about: threads take stripes in turn,
// so up to 64 threads at once each write their own line.
inline constexpr unsigned kStripes = 64;
using StripedCounter = std::atomic<std::uint64_t> Stripe::*;

extern Stripe g_stripes[kStripes];
extern __thread Stripe* t_stripe __attribute__((tls_model("initial-exec")));
BRISK_NOINLINE Stripe* assign_stripe();  // this thread's stripe, the next one in turn

inline Stripe* stripe_of_this_thread() {
  Stripe* s = t_stripe;
  return BRISK_LIKELY(s != nullptr) ? s : assign_stripe();
}

// Atomic, since threads past kStripes share stripes.
inline void add(StripedCounter c, std::int64_t d) {
  (stripe_of_this_thread()->*c).fetch_add(static_cast<std::uint64_t>(d), std::memory_order_relaxed);
}

// The sum of c over the stripes: exact while no thread writes c. Meanwhile the stripes, read
// one after another, are no snapshot: a chain queued on one stripe and taken on another, or a
// large block allocated and freed by two threads, may be seen taken or freed only, so the sum
// may run below the true value for a moment, and reads 0 rather than wrapping below zero.
std::uint64_t sum(StripedCounter c);

}  // namespace brisk::stats
