// Process-wide counters. Updated only on slow paths (never on the per-allocation fast path),
// with relaxed atomics; read by brisk_get_stats(), which adds what it derives from span state
// (threadcache/heap_stats.cc).
#pragma once

#include <atomic>
#include <cstdint>

namespace brisk::stats {

struct Counters {
  std::atomic<std::uint64_t> chunks_mapped{0};
  std::atomic<std::uint64_t> chunks_cached{0};
  std::atomic<std::uint64_t> large_bytes_mapped{0};
  std::atomic<std::uint64_t> large_bytes_cached{0};
  std::atomic<std::uint64_t> large_live_blocks{0};
  std::atomic<std::uint64_t> os_map_calls{0};
  std::atomic<std::uint64_t> os_unmap_calls{0};
  std::atomic<std::uint64_t> os_decommit_calls{0};
  std::atomic<std::uint64_t> os_resident_calls{0};  // platform::resident_bytes (mincore)
  std::atomic<std::uint64_t> heaps_live{0};
  std::atomic<std::uint64_t> heaps_total{0};
  std::atomic<std::uint64_t> spans_orphaned{0};
  std::atomic<std::uint64_t> large_bytes_in_use{0};   // usable bytes of live large blocks
  // Bytes of remote frees inside RemoteQueues (the orphan queue included): added before a chain
  // is pushed, subtracted once per chain taken, so a reader may see a chain twice, never not at all.
  std::atomic<std::uint64_t> remote_queued_bytes{0};
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

}  // namespace brisk::stats
