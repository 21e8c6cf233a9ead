// Runtime options: tier 2 of brisk's configuration. One table (options.cc); each option has a
// name, a type, a BRISK_<NAME> environment variable read once, lazily, on first use (never before
// the environment exists), and a default per strategy. Documented in the README's
// "Configuration" and "Strategy".
//
// The strategy (speed, balanced, low-memory) moves many levers at once: an option the user did
// not set takes the value of the strategy in force at the moment it is read, so a switch reaches
// every thread at its next slow path that reads the lever (a refill, a free batch, a purge
// check). An option set in the environment keeps its value under every strategy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace brisk::options {

enum class Id : unsigned {
  kChunkCache,        // BRISK_CHUNK_CACHE: empty 4 MiB chunks kept mapped (decommitted) process-wide
  kLargeCacheBytes,   // BRISK_LARGE_CACHE_BYTES: address space of freed large blocks kept for reuse
  kLargeDirtyBytes,   // BRISK_LARGE_DIRTY_BYTES: of which kept as freed (counted by size)
  kLargeDecayMs,      // BRISK_LARGE_DECAY_MS: how long a freed large block stays resident unused
  kPurgeBytes,        // BRISK_PURGE_BYTES: span bytes a thread releases between purge checks
  kPurgeDelayMs,      // BRISK_PURGE_DELAY_MS: how long a free page stays resident unused before purge
  kDebugQuarantine,   // BRISK_DEBUG_QUARANTINE: bytes of freed debug blocks held back before reuse
  kDebug,             // BRISK_DEBUG: 1 turns debug mode on at start-up
  kDebugStackDepth,   // BRISK_DEBUG_STACK_DEPTH: frames kept per allocation and free (0: none)
  kDebugLeaks,        // BRISK_DEBUG_LEAKS: the leak report at exit: 1 unreachable blocks, 2 all live ones, 0 none
  kRetainedSpans,     // BRISK_RETAINED_SPANS: emptied multi-page spans a thread keeps as current
  kRemoteBatchBytes,  // BRISK_REMOTE_BATCH_BYTES: a remote-free batch is sent at this many bytes
  kBackground,        // BRISK_BACKGROUND: 1 runs the background thread that returns idle memory
  kIdleMs,            // BRISK_IDLE_MS: a heap with no slow path this long is idle (background.cc)
  kPurgeAdvice,       // BRISK_PURGE_ADVICE: how decay purges give pages back: 0 MADV_DONTNEED, 1 MADV_FREE
  kStats,             // BRISK_STATS: 1 prints brisk_print_stats' table to stderr at exit, 2 its JSON
  kDebugAction,       // BRISK_DEBUG_ACTION: abort (0, the default) or report (1): go on after a debug report
  kDebugFillLimit,    // BRISK_DEBUG_FILL_LIMIT: debug blocks up to this size get fill patterns on every byte
  kRetainedBytes,     // BRISK_RETAINED_BYTES: carved bytes of the multi-page spans a thread keeps emptied
  kPurgeReused,       // BRISK_PURGE_REUSED: 1: a decay purge also takes pages used since its previous check
  kPurgeSpanTails,    // BRISK_PURGE_SPAN_TAILS: 1: a new small span gives back the resident pages past its first carve; 2: at its thread's exit too
  kMediumMax,         // BRISK_MEDIUM_MAX: blocks above it (up to kMediumMax) are large blocks, not chunk page runs
  kMediumCacheBytes,  // BRISK_MEDIUM_CACHE_BYTES: page runs of freed medium blocks a thread keeps for its next ones
  kForeignCacheBytes, // BRISK_FOREIGN_CACHE_BYTES: other heaps' freed blocks a thread keeps for its own allocations
  kForeignCacheAlways, // BRISK_FOREIGN_CACHE_ALWAYS: 1: a class is kept once refilled, not only while the thread grows in it
  kLargeStashBytes,   // BRISK_LARGE_STASH_BYTES: the largest freed large mapping a thread keeps for its next large block
  kDebugReallocMoves, // BRISK_DEBUG_REALLOC_MOVES: 1: debug mode's realloc moves every block, never resizing in place
  kPopulate,          // BRISK_POPULATE: carving makes the fresh OS pages it writes present by madvise, up to this many a call
  kSpanKeep,          // BRISK_SPAN_KEEP: spans with free blocks a thread keeps per class beside its current one (0: all)
  kKeptSpanBytes,     // BRISK_KEPT_SPAN_BYTES: bytes of emptied small spans the central pools keep whole for their class
  kCount
};

// Each option's value under the strategy in force (the environment's, if set), plus one; 0
// (kUnresolved) until get() first reads it and after a switch of strategy. So get(), which the
// medium and large paths call several times per block, is a load, a compare and a subtract.
inline constexpr std::int64_t kUnresolved = 0;
extern std::atomic<std::int64_t> g_value[static_cast<unsigned>(Id::kCount)];
std::int64_t get_slow(Id id);
inline std::int64_t get(Id id) {
  const std::int64_t v = g_value[static_cast<unsigned>(id)].load(std::memory_order_relaxed);
  return __builtin_expect(v != kUnresolved, 1) ? v - 1 : get_slow(id);
}

// The strategy: BRISK_STRATEGY=speed|balanced|low-memory at start, brisk_set_strategy later.
// The values are brisk.h's BRISK_STRATEGY_* constants.
enum class Strategy : int { kSpeed = 0, kBalanced = 1, kLowMemory = 2 };
inline constexpr int kStrategyCount = 3;
Strategy strategy();
void set_strategy(Strategy s);
// Bumps the epoch and drops every value get() kept: set_strategy, and a fork child.
void drop_kept_values();
// Bumped by every set_strategy: a slow path that caches lever values compares it, and reads
// them with get_for(id, strategy()) after it (get() may briefly answer for the old strategy).
// Inline: alloc_refill compares it on every refill, which the foreign cache's blocks reach on
// every allocation (as a call: 0.7% of xmalloc's samples).
extern std::atomic<std::uint32_t> g_epoch;
inline std::uint32_t strategy_epoch() { return g_epoch.load(std::memory_order_acquire); }

// The value `id` would have under strategy s (the environment's, if set): for the README's
// table test and brisk-stress's report.
std::int64_t get_for(Id id, Strategy s);

// Reads every BRISK_* variable of the table and BRISK_STRATEGY now, reporting each invalid one on
// stderr, rather than at the first use of its lever (which may come late, or never). The entry
// layer calls it at load; brisk_core leaves the variables to be read on first use, so a unit
// test may still set one before it reads it.
void read_environment();

}  // namespace brisk::options
