// The brisk_* C API (include/brisk/brisk.h): the same entry points as malloc and free, under
// brisk's own names, plus what only brisk offers (collect, statistics). Built into every
// library, the non-replacing brisk_core included.
#include <brisk/brisk.h>

#include <errno.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "core/central_pool.h"
#include "core/config.h"
#include "core/options.h"
#include "core/page_cost.h"
#include "core/large.h"
#include "core/platform.h"
#include "core/stats.h"
#include "debug/block.h"
#include "debug/mode.h"
#include "debug/report.h"
#include "override/entry.h"
#include "threadcache/background.h"
#include "threadcache/heap_stats.h"
#include "threadcache/orphans.h"

using namespace brisk;

extern "C" {

BRISK_EXPORT void* brisk_malloc(size_t size) { return malloc_inline(size); }
BRISK_EXPORT void* brisk_calloc(size_t count, size_t size) { return calloc_inline(count, size); }
BRISK_EXPORT void* brisk_realloc(void* p, size_t size) { return realloc_impl(p, size); }
BRISK_EXPORT void brisk_free(void* p) { free_inline(p); }
BRISK_EXPORT void brisk_free_sized(void* p, size_t size) { free_checked_impl(p, 0, size); }
BRISK_EXPORT void* brisk_aligned_alloc(size_t alignment, size_t size) {
  return aligned_alloc_impl(alignment, size);
}
BRISK_EXPORT size_t brisk_usable_size(const void* p) { return usable_size_impl(p); }

BRISK_EXPORT void brisk_thread_collect(void) { thread_collect(); }
BRISK_EXPORT size_t brisk_trim(void) {
  // The quarantine's blocks first: what they held goes back with their spans below.
  debug::flush_quarantine();
  return process_trim();
}

BRISK_EXPORT int brisk_set_strategy(brisk_strategy strategy) {
  int s = static_cast<int>(strategy);
  if (s < 0 || s >= options::kStrategyCount) {
    errno = EINVAL;
    return -1;
  }
  options::set_strategy(static_cast<options::Strategy>(s));
  release_kept_spans_past_budget();  // low-memory keeps none
  background_maybe_start();  // if the new strategy wants it, and the process is multithreaded
  return 0;
}
BRISK_EXPORT brisk_strategy brisk_get_strategy(void) {
  return static_cast<brisk_strategy>(options::strategy());
}
static_assert(BRISK_STRATEGY_SPEED == static_cast<int>(options::Strategy::kSpeed) &&
              BRISK_STRATEGY_BALANCED == static_cast<int>(options::Strategy::kBalanced) &&
              BRISK_STRATEGY_LOW_MEMORY == static_cast<int>(options::Strategy::kLowMemory));

namespace {

void fill_stats(brisk_stats* out) {
  auto& g = stats::g;
  auto rd = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  out->chunks_mapped = rd(g.chunks_mapped);
  out->chunk_bytes_mapped = rd(g.chunks_mapped) * kChunkSize;
  out->large_bytes_mapped = stats::sum(&stats::Stripe::large_bytes_mapped);
  out->large_bytes_cached = stats::sum(&stats::Stripe::large_bytes_cached);
  out->large_live_blocks = stats::sum(&stats::Stripe::large_live_blocks);
  out->os_map_calls = rd(g.os_map_calls);
  out->os_unmap_calls = rd(g.os_unmap_calls);
  out->os_decommit_calls = rd(g.os_decommit_calls);
  out->heaps_live = rd(g.heaps_live);
  out->heaps_total = rd(g.heaps_total);
  out->spans_orphaned = stats::sum(&stats::Stripe::spans_orphaned);
  out->chunk_bytes_cached = rd(g.chunks_cached) * kChunkSize;

  SpanTotals t;
  gather_span_totals(&t);
  out->small_bytes_in_use = t.small_bytes_in_use;
  out->medium_bytes_in_use = t.medium_bytes_in_use;
  out->large_bytes_in_use = stats::sum(&stats::Stripe::large_bytes_in_use);
  out->small_live_blocks = t.small_live_blocks;
  out->medium_live_blocks = t.medium_live_blocks;
  out->remote_queued_bytes = t.remote_queued_bytes;
  uint64_t handed_out = t.small_bytes_in_use + t.medium_bytes_in_use + out->large_bytes_in_use;
  out->bytes_in_use = handed_out > t.remote_queued_bytes ? handed_out - t.remote_queued_bytes : 0;
  out->thread_cache_bytes = t.thread_cache_bytes;
  out->central_pool_bytes = t.central_pool_bytes;
  out->large_cache_resident_bytes = large_cache_resident_bytes();
  out->chunk_bytes_free = t.free_page_bytes;
  out->chunk_bytes_free_resident = t.free_resident_bytes;
  out->bytes_mapped = out->chunk_bytes_mapped + out->large_bytes_mapped;
  uint64_t large_live_mapped =
      out->large_bytes_mapped > out->large_bytes_cached ? out->large_bytes_mapped - out->large_bytes_cached : 0;
  out->bytes_resident = t.resident_estimate + large_live_mapped + out->large_cache_resident_bytes;
  out->process_rss_bytes = platform::process_resident_bytes();
  out->kept_span_bytes = CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed);
  out->os_populate_calls = stats::g.os_populate_calls.load(std::memory_order_relaxed);
  const page_cost::Costs costs = page_cost::costs();
  out->page_fault_ns = costs.fault_ns;
  out->page_populate_ns = costs.populate_ns;
}

// brisk_stats as programs built before brisk_get_stats_sized know it (the symbol
// brisk_get_stats writes these 28 fields): fields are only ever appended after it.
constexpr std::size_t kStatsUnsizedBytes = offsetof(brisk_stats, kept_span_bytes) + sizeof(uint64_t);
static_assert(kStatsUnsizedBytes == 28 * sizeof(uint64_t), "brisk_get_stats's fields keep their offsets");

}  // namespace

BRISK_EXPORT size_t brisk_get_stats_sized(brisk_stats* out, size_t size) {
  if (out != nullptr && size != 0) {
    brisk_stats all;
    fill_stats(&all);
    std::memcpy(out, &all, size < sizeof all ? size : sizeof all);
  }
  return sizeof(brisk_stats);
}
BRISK_EXPORT void(brisk_get_stats)(brisk_stats* out) { brisk_get_stats_sized(out, kStatsUnsizedBytes); }

BRISK_EXPORT size_t brisk_get_class_stats(brisk_class_stats* out, size_t max) {
  static_assert(BRISK_SIZE_CLASSES == kNumClasses, "brisk.h's class count");
  if (out == nullptr || max == 0) return kNumClasses;
  SpanTotals t;
  gather_span_totals(&t);
  for (size_t c = 0; c < kNumClasses && c < max; ++c) {
    out[c].block_size = kClasses[c].size;
    out[c].live_blocks = t.classes[c].live_blocks;
    out[c].free_blocks = t.classes[c].free_blocks;
    out[c].spans = t.classes[c].spans;
  }
  return kNumClasses;
}

BRISK_EXPORT size_t brisk_get_thread_stats(brisk_thread_stats* out, size_t max) {
  if (out == nullptr) max = 0;
  size_t total = attached_heaps(nullptr, 0);
  // In batches of heaps, one walk of the chunks each: nothing is allocated.
  constexpr size_t kBatch = 64;
  size_t filled = 0;
  while (filled < max) {
    const Heap* heaps[kBatch];
    size_t n = attached_heaps(heaps, kBatch, filled);  // threads may have come and gone
    n = n > filled ? n - filled : 0;
    if (n > kBatch) n = kBatch;
    if (n > max - filled) n = max - filled;
    if (n == 0) break;
    HeapCounts counts[kBatch];
    for (size_t i = 0; i < n; ++i) counts[i].heap = heaps[i];
    SpanTotals t;
    gather_span_totals(&t, counts, n);
    for (size_t i = 0; i < n; ++i) {
      brisk_thread_stats& o = out[filled + i];
      o.heap_id = heaps[i]->id;
      o.thread_id = heaps[i]->thread_id.load(std::memory_order_relaxed);
      o.cache_bytes = counts[i].cache_bytes;
      o.remote_frees_sent = remote_frees_sent(heaps[i]);
      o.remote_frees_received = heaps[i]->remote_frees_received.load(std::memory_order_relaxed);
    }
    filled += n;
  }
  // Entries of threads that exited during the call are left zero.
  for (size_t i = filled; i < max && i < total; ++i) out[i] = brisk_thread_stats{};
  return total;
}

BRISK_EXPORT size_t brisk_get_lock_stats(brisk_lock_stats* out, size_t max) {
  static_assert(BRISK_LOCK_STRUCTURES == kLockedStructures, "brisk.h's structure count");
  if (out == nullptr) return kLockedStructures;
  LockCounts counts[kLockedStructures];
  gather_lock_counts(counts);
  for (size_t i = 0; i < kLockedStructures && i < max; ++i)
    out[i] = brisk_lock_stats{kLockedStructureNames[i], counts[i].acquisitions, counts[i].contended, counts[i].yields};
  return kLockedStructures;
}

BRISK_EXPORT void brisk_debug_enter(void) { debug::enter(); }
BRISK_EXPORT void brisk_debug_exit(void) { debug::exit(); }
BRISK_EXPORT int brisk_debug_active(void) { return debug::active() ? 1 : 0; }
BRISK_EXPORT int brisk_check_heap(void) { return debug::check_heap(); }
BRISK_EXPORT void brisk_debug_set_report_callback(void (*callback)(const char*, size_t, void*), void* context) {
  debug::set_report_callback(callback, context);
}

}  // extern "C"
