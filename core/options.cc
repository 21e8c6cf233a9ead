#include "core/options.h"

#include <atomic>
#include <cstdlib>

#include "core/platform.h"

namespace brisk::options {
constinit std::atomic<std::uint32_t> g_epoch{0};

namespace {

struct Option {
  Id id;  // the entry's own id: the table is checked against the enum, row by row
  const char* env;
  std::int64_t by_strategy[kStrategyCount];  // default under speed, balanced, low-memory
  std::int64_t min;
  std::int64_t max;
  // For an option set by name: its values' names, the value being the index (nullptr-ended).
  const char* const* names = nullptr;
};

constexpr std::int64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

// The levers table of the README's "Strategy" section lists the rows whose defaults differ by
// strategy; keep the two in step (tests/strategy_test.cc compares them with the README).
constexpr const char* kDebugActionNames[] = {"abort", "report", nullptr};

constexpr Option kTable[] = {
    {Id::kChunkCache, "BRISK_CHUNK_CACHE", {32, 8, 1}, 0, 4096},
    // The large cache (core/large.cc). Its address space costs no memory, only the mmap, trim
    // and munmap that reuse saves; MMtest's large test on 10 threads cycles up to 10 x 550 MiB.
    {Id::kLargeCacheBytes, "BRISK_LARGE_CACHE_BYTES", {16 * GiB, 4 * GiB, 1 * GiB}, 0, std::int64_t{1} << 44},
    // Counted by size, so untouched blocks count too: a budget below the blocks a program
    // cycles turns each free into a madvise call: low-memory at 256m ran MMtest's large test as
    // written on 10 threads in over 8 s, against 0.2-0.4 s at 1g. So even low-memory keeps 1g,
    // and returns memory through its short decay instead. Low-memory at 16k (every freed mapping
    // decommitted at its free; Intel VM, 2026-12-06, 5 pairs of both suites): peaks prodcons
    // 60.9 -> 39.4 MiB, large-replace 370.5 -> 243.9, realloc 40.6 -> 34.7 (the leanest of all
    // peers on each), at 1.19x, 1.08x and 1.31x the time; MMtest large 4.4x, large-raw 6.1x and
    // strings-raw 2.4x the time for no memory. A freed mapping reused as it was carries its
    // resident pages into the next block, which may write elsewhere, and only a decommit at free
    // stops that. (Under two pages, the budget caches nothing: every entry needs that room.)
    {Id::kLargeDirtyBytes, "BRISK_LARGE_DIRTY_BYTES", {8 * GiB, 2 * GiB, 1 * GiB}, 0, std::int64_t{1} << 44},
    // A large block freed and not reused is all page faults to fill again: speed keeps it 10 s
    // (jemalloc's dirty decay), balanced 1 s, low-memory 10 ms (its background thread passes
    // every purge delay while anything is left to age). Low-memory at 10 ms against 50 (Intel
    // VM, 5 pairs of both suites): realloc's peak 56.9 -> 48.0 MiB, large-replace's 437 ->
    // 363, every time interval containing 1; large-replace at full scale 1.31 -> 1.07 GiB at
    // 6.6x balanced's time against 4.1x (jemalloc: 892 MiB at 10.6x). At 0, large-raw (blocks
    // never touched) took 6x the time: every free decommits.
    {Id::kLargeDecayMs, "BRISK_LARGE_DECAY_MS", {10000, 1000, 10}, 0, 3600 * 1000},
    {Id::kPurgeBytes, "BRISK_PURGE_BYTES", {32 * MiB, 8 * MiB, 1 * MiB}, 0, std::int64_t{1} << 44},
    {Id::kPurgeDelayMs, "BRISK_PURGE_DELAY_MS", {2000, 100, 10}, 0, 3600 * 1000},
    // 512 KiB per shard: a block leaving the quarantine is still in a 1 MiB L2 for its check
    // (README "Debug mode" has the numbers against 16 MiB).
    {Id::kDebugQuarantine, "BRISK_DEBUG_QUARANTINE", {4 * MiB, 4 * MiB, 4 * MiB}, 0, std::int64_t{1} << 40},
    {Id::kDebug, "BRISK_DEBUG", {0, 0, 0}, 0, 1},
    {Id::kDebugStackDepth, "BRISK_DEBUG_STACK_DEPTH", {8, 8, 8}, 0, 64},
    {Id::kDebugLeaks, "BRISK_DEBUG_LEAKS", {1, 1, 1}, 0, 2},
    {Id::kRetainedSpans, "BRISK_RETAINED_SPANS", {16, 16, 16}, 0, 16},
    // Speed keeps balanced's 256 KiB: at 1 MiB a freeing thread held blocks of up to 1 MiB four
    // times as long before sending them, and their owners took fresh memory meanwhile (speed
    // mode on the realloc workload: 0.930 [0.900, 0.998] of the time and 116 MiB instead of 132
    // at 256 KiB; prodcons, xmalloc and realloc at full scale in one process: 144 MiB instead of
    // 192, time level; no other row of either suite moved).
    {Id::kRemoteBatchBytes, "BRISK_REMOTE_BATCH_BYTES", {256 * KiB, 256 * KiB, 64 * KiB}, 0, std::int64_t{1} << 30},
    {Id::kBackground, "BRISK_BACKGROUND", {0, 1, 1}, 0, 1},
    {Id::kIdleMs, "BRISK_IDLE_MS", {10000, 1000, 200}, 10, 3600 * 1000},
    {Id::kPurgeAdvice, "BRISK_PURGE_ADVICE", {1, 0, 0}, 0, 1},
    {Id::kStats, "BRISK_STATS", {0, 0, 0}, 0, 2},
    {Id::kDebugAction, "BRISK_DEBUG_ACTION", {0, 0, 0}, 0, 1, kDebugActionNames},
    // Debug blocks above this carry their fill patterns on their first and last 4 KiB only
    // (debug/block.h). 1 MiB: the largest medium block of the speed and balanced modes; above
    // it a block is a mapping of its own, and each of its pages the fills touch costs a fault.
    // Against 4m (Intel VM, 7 pairs of both suites, debug mode without stacks, times over
    // release brisk's): prodcons 2.391 -> 1.950, large-replace 1.261 -> 1.046, MMtest large
    // 1.267 -> 1.113; no other row moved beyond its interval.
    {Id::kDebugFillLimit, "BRISK_DEBUG_FILL_LIMIT", {1 * MiB, 1 * MiB, 1 * MiB}, 0, std::int64_t{1} << 44},
    // With BRISK_RETAINED_SPANS, bounds what an idle thread's kept spans hold resident (their
    // carved blocks) rather than how many classes keep one: 8m binds only when the classes kept
    // hold spares too (at most 16 x 2 x 256 KiB). Low-memory keeps 1m, what its former limit of
    // 2 spans allowed at worst when the largest spans were 512 KiB, but over as many
    // classes as fit: MMtest medium cycles 6 such classes holding 1-2 carved blocks each, and
    // releasing 4 of them every round moved its spans over pages its medium blocks had touched
    // (peak RSS 34 MiB at 10 threads against balanced's 22).
    {Id::kRetainedBytes, "BRISK_RETAINED_BYTES", {8 * MiB, 8 * MiB, 1 * MiB}, 0, std::int64_t{1} << 40},
    // Whether a page free at two purge checks is purged although it was claimed in between.
    // Sparing it keeps a steady workload's pages resident (balanced MMtest medium: 6x fewer page
    // faults); purging it is low-memory's trade: producer/consumer peak RSS 130 -> 73 MiB and
    // realloc 139 -> 120 at 2-3x the faults (README "Returning memory").
    {Id::kPurgeReused, "BRISK_PURGE_REUSED", {0, 0, 1}, 0, 1},
    // A small span is carved one OS page at a time, but claims whole 64 KiB pages, resident ones
    // first (no fault); what it has not carved yet no other span or block can use. With a span
    // per class per thread and few blocks in each, that was 17-54 MiB of the realloc-chain and
    // producer/consumer workloads' peaks (at 115-150 MiB). 1: a new span's tail goes back in
    // batches while its thread runs (threadcache/span_pages.cc), at the cost of a fault or a
    // populate call for each page carved later; 2: also the tails pending at the thread's exit
    // (README "Returning memory", span tails, has the numbers).
    // Balanced gives tails back while their thread runs but not when it exits: a thread's exit
    // hands its spans on (orphans that the next thread short of the class takes and carves,
    // kept spans, pages back to their chunks, which decay), and giving their tails back there
    // made the threads that took them fault the pages in again. Balanced at 1 against 0 (Intel
    // VM, 7 pairs of both suites, 2026-12-07, a scratch build; README "Span tails" has the runs
    // of the landed code): realloc 0.960 [0.914, 0.984] of the time at 0.80x
    // the peak, prodcons 0.937 [0.823, 0.982] at 0.80x, larson 0.972 [0.945, 1.017] at 0.93x,
    // strings-raw 1.033 [1.017, 1.055] at 0.96x; no other interval above 1. At 2 (low-memory's)
    // larson took 1.092 [1.037, 1.146] of the time at 0.89x the peak (about a process_madvise
    // at each of its 100 thread exits) and churn 1.065; the other rows' peaks were alike.
    {Id::kPurgeSpanTails, "BRISK_PURGE_SPAN_TAILS", {0, 1, 2}, 0, 2},
    // Medium blocks are page runs inside 4 MiB chunks: a block of up to 2 MiB needs that many
    // free pages in a row in one chunk, and on the producer/consumer and realloc-chain workloads
    // the runs left between live blocks were too short for the next big one, which took fresh
    // pages. Above this size a block is a mapping of its own (the large cache, and the thread's
    // large stash). Low-memory at 512k: prodcons peak 78 -> 54 MiB, realloc 64 -> 50, with fewer
    // faults and no time lost. Speed and balanced at 1m (from 2m; Intel VM, 2026-12-03):
    // prodcons at full scale 0.943 [0.899, 0.981] of the time at 128 MiB instead of 167, the
    // rest of both suites level (README "Returning memory"). Not lower: at 256k prodcons took
    // 1.084 [1.010, 1.118] of the time at full scale (the large path's one lock and 4 MiB
    // carving cost more than a chunk's page run for blocks malloc makes). A block that realloc
    // grows past 256 KiB becomes large whatever this says (override/entry.cc's grow_elsewhere):
    // a large block grows into the cached space after it without a copy.
    {Id::kMediumMax, "BRISK_MEDIUM_MAX", {1 * MiB, 1 * MiB, 512 * KiB}, 64 * KiB, 2 * MiB},
    // A freed medium block's page run stays with its thread, up to kMediumCacheSlots runs of
    // this many bytes in all, for the thread's next medium block (threadcache/medium.cc): a run
    // given back to its chunk and claimed again costs two compare-and-swaps on the chunk's page
    // sets and the descriptor's set-up: a malloc+free pair of 100 KB runs about 620 instructions
    // without the cache and 316 with it (callgrind, brisk-pair-loop 100000).
    // Low-memory keeps 2m too. Without a cache, a block that realloc grows past its run's end
    // moves unless the pages after it are free, and on MMtest's medium test (blocks of 10-100
    // KB, each reallocated to twice its size) 3,534 of 4,000 such reallocs moved on the
    // 10-thread row, against 1,026 with it: a block that takes a cached run of up to half again
    // its pages has room to grow. At --scale 1 (15 pairs, low-memory with 2m against 0): medium
    // 0.762 of the time at 13.1 MiB against 19.2, medium-raw 0.435 at 11.5 against 18.2; strings
    // 1.05-1.10x the peak (17 -> 18.1-18.9 MiB); realloc 1.01-1.09x and prodcons 0.88-1.09x
    // in runs whose medians move by as much. 1m kept half of the medium rows' gain.
    {Id::kMediumCacheBytes, "BRISK_MEDIUM_CACHE_BYTES", {8 * MiB, 2 * MiB, 2 * MiB}, 0, std::int64_t{1} << 40},
    // Small blocks of other threads' spans that a thread frees, kept for its own next allocations
    // of their class (threadcache/foreign_cache.h) rather than sent home. It must hold what a
    // thread frees between two runs of allocations: the xmalloc ring frees 4,096 x 64 B plus a
    // 32 KiB record per round, and at 256k it overflowed every round (0.997 of the time without
    // the cache; 1m 0.736, 4m 0.722, peak RSS 31 -> 13 MiB; these runs and the next were made
    // under 8b0aa97's rule for which classes are kept). Low-memory keeps 512k: against 256k (9
    // pairs of the stress suite in low-memory mode) xmalloc took 0.609 of the time at 0.54x the
    // peak RSS and larson-classic 0.85x the peak, prodcons 1.05x and realloc 1.03x; 1m held
    // 1.14x and 1.12x on those two. Speed keeps 4m, more room for the same trade: under the
    // current rule 1m instead left every stress row's interval containing 1 but churn's (1.009
    // [1.003, 1.041], 7 pairs).
    {Id::kForeignCacheBytes, "BRISK_FOREIGN_CACHE_BYTES", {4 * MiB, 1 * MiB, 512 * KiB}, 0, std::int64_t{1} << 40},
    // 1: a class is kept in the foreign cache from its first refill on, not only while the thread
    // grows in it (foreign_cache.h). A block handed out from the cache stays another heap's, so
    // kept blocks may circulate through the slow paths for as long as the thread runs, in place
    // of the thread's own spans growing: low-memory's trade. Low-memory with 1 against 0 (9 pairs
    // of the stress suite, 17:28 UTC): larson-classic 0.57x the peak RSS (45.4 MiB against 76.2)
    // at 0.948 of the time, prodcons 0.94x, larson 0.93x, realloc 0.95x, xmalloc 0.84x, churn
    // 1.15x (time 1.039 [0.999, 1.072]); at full scale larson-classic 0.83x the peak at 1.216
    // [1.133, 1.264]x the time, larson 0.95x at 0.950, churn level.
    {Id::kForeignCacheAlways, "BRISK_FOREIGN_CACHE_ALWAYS", {0, 0, 1}, 0, 1},
    // The large stash (threadcache/medium.cc): the mapping of the last large block a thread
    // allocated and freed, kept for its own next large block if it holds at most this many bytes
    // (and kMediumMax). Low-memory keeps none: its smaller BRISK_MEDIUM_MAX makes blocks of
    // 512 KiB-2 MiB large, and a thread growing a buffer by doubling frees mappings it never
    // takes again (MMtest strings-raw, low-memory with a 2m medium cache: 26.8 MiB peak with a
    // 2m stash, 24.3 without, the time the same).
    {Id::kLargeStashBytes, "BRISK_LARGE_STASH_BYTES", {2 * MiB, 2 * MiB, 0}, 0, std::int64_t{1} << 40},
    // Debug mode resizes a block in place where the memory it is carved from has room or can
    // grow, as glibc's checking mode does; 1 moves every block, as valgrind and ASan do, so that
    // code that keeps using the old pointer writes into the quarantine and is reported (debug/
    // block.h, realloc_in_place).
    {Id::kDebugReallocMoves, "BRISK_DEBUG_REALLOC_MOVES", {0, 0, 0}, 0, 1},
    // Lazy carving's first write to a fresh OS page, made present by one MADV_POPULATE_WRITE
    // instead of a page fault (threadcache/carve.cc, populate_carved) while that measures
    // cheaper in the running process (core/page_cost.h: on the same kind of VM two days later,
    // kernel 6.18, a fault took 4.0 us and a populated page 4.6, and carving measures both since
    // then; the numbers below are from when populate was always taken). Against the build
    // before it (two runs of 7 pairs of the stress suite, AMD EPYC VM whose faults cost 10 us):
    // larson-classic 0.908 [0.870, 0.930] and 0.925 [0.898, 0.961] of the time, churn 0.920
    // [0.900, 0.971] and 0.945 [0.867, 0.998], alloc-test 0.950 [0.932, 0.969] and 0.923 [0.902,
    // 0.982], larson 0.940 and 0.949 [0.917, 0.995]; no row's interval above 1 in either, and the
    // same library with 0 level with the build before on every row. 0: the writes fault them in.
    // Above 1, a span that has carved 4 OS pages asks for the next ones up to this many at a
    // time (a page cost 7.3 us populated alone, 5.7 us in calls of 4): speed's trade, since a
    // span that stops growing keeps up to n - 1 pages it never uses. Speed with 4 against speed with
    // 1 (7 pairs of the stress suite): churn 0.953 [0.926, 0.968] of the time, xmalloc 0.913
    // [0.909, 1.000], larson 0.973, mstress 0.968, cache-scratch 1.014 [1.004, 1.022]; sh6bench
    // at 1.07x its peak. Balanced with 4 (a draft, against 1): churn 0.945, larson-classic 0.966
    // [0.957, 0.980], alloc-test 0.966, but sh6bench at 1.08x its peak and larson 1.07x.
    {Id::kPopulate, "BRISK_POPULATE", {4, 1, 1}, 0, 16},
    // How many spans with free blocks a thread keeps per class besides the one it allocates from;
    // 0 keeps every one. Past it, a full span of the thread's that other threads' frees give room
    // to goes to the central pool as an orphan when the thread drains its queue
    // (threadcache/remote_free.cc's shed_refilled), where the next thread to refill the class
    // takes it, and a thread freeing into an orphan span adopts it only below the limit
    // (otherwise the block goes home through the orphan queue, one central pool lock each).
    // Room that the thread's own frees make stays its own. Free room then serves whichever
    // thread runs short of the class, not only the thread that happens to own the span.
    {Id::kSpanKeep, "BRISK_SPAN_KEEP", {0, 4, 1}, 0, 1 << 20},
    // Emptied small spans kept whole in their class's central pool (threadcache/orphans.cc,
    // keep_empty_span), by the bytes their blocks may have written; each goes back to its chunk
    // after BRISK_PURGE_DELAY_MS unused. Balanced at 16m against 0 (AMD VM, 5 pairs): larson
    // 0.89 of the time at 27.9 MiB instead of 34.4, churn 0.84 at 37.5 instead of 49.6; at 4m
    // churn kept 44.7 MiB, at 1m neither row moved. 64m changed nothing further at the
    // stress suite's scales, and speed mode, which has no background thread, keeps what it
    // holds until a keep of the class, a purge check, a collect or a trim: a review's probe of
    // 16 threads exiting held 64 MiB kept (and the free pages of the chunks those spans kept
    // from emptying) for good at 64m, so speed keeps balanced's 16m. Low-memory keeps none: with 2m its churn and larson peaks rose
    // 1.05-1.1x (for 0.72-0.82 of the time), and it is the mode that trades time for memory.
    {Id::kKeptSpanBytes, "BRISK_KEPT_SPAN_BYTES", {16 * MiB, 16 * MiB, 0}, 0, std::int64_t{1} << 40},
};
constexpr unsigned kOptionCount = static_cast<unsigned>(Id::kCount);
static_assert(sizeof kTable / sizeof kTable[0] == kOptionCount, "one row per option id");
constexpr bool rows_in_id_order() {
  for (unsigned i = 0; i < kOptionCount; ++i)
    if (static_cast<unsigned>(kTable[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(), "kTable's rows must be in Id order: get() indexes by id");
constexpr bool minimums_not_negative() {
  for (const Option& o : kTable)
    if (o.min < 0) return false;
  return true;
}
static_assert(minimums_not_negative(), "g_env stores value + kBias, which needs values >= 0");

// g_env[i]: 0 before the first get() of the process reads option i's variable (before any
// thread exists, or racing benignly: each reader computes the same value), kUnsetStored if the
// environment sets none, else its value + kBias (every value is >= 0: the table's minimums).
constexpr std::int64_t kUnsetStored = 1;
constexpr std::int64_t kBias = 2;
constexpr std::int64_t kUnset = -1;  // env_value's "not set" (every real value is >= 0)
constinit std::atomic<std::int64_t> g_env[kOptionCount] = {};

constexpr int kStrategyUnread = -1;
std::atomic<int> g_strategy{kStrategyUnread};

void complain(const char* what, const char* name) {
  platform::write_stderr(what, __builtin_strlen(what));
  platform::write_stderr(name, __builtin_strlen(name));
  platform::write_stderr("\n", 1);
}

// Parses a decimal number with an optional k/m/g suffix. Returns false on junk.
bool parse(const char* s, std::int64_t* out) {
  std::int64_t v = 0;
  if (*s == '\0') return false;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (*s - '0');
  }
  int shift = 0;
  if (*s == 'k' || *s == 'K') shift = 10, ++s;
  else if (*s == 'm' || *s == 'M') shift = 20, ++s;
  else if (*s == 'g' || *s == 'G') shift = 30, ++s;
  if (*s != '\0') return false;
  if (v > (INT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

// The index of s in names (nullptr-ended). Returns false if it is none of them.
bool parse_name(const char* s, const char* const* names, std::int64_t* out) {
  for (std::int64_t i = 0; names[i] != nullptr; ++i) {
    if (__builtin_strcmp(s, names[i]) == 0) {
      *out = i;
      return true;
    }
  }
  return false;
}

// Option i's value from the environment, or kUnset.
std::int64_t env_value(unsigned i) {
  std::int64_t v = g_env[i].load(std::memory_order_relaxed);
  if (v != 0) return v == kUnsetStored ? kUnset : v - kBias;
  const Option& o = kTable[i];
  v = kUnset;
  if (const char* s = platform::get_env(o.env)) {
    std::int64_t parsed;
    bool ok = o.names != nullptr ? parse_name(s, o.names, &parsed) : parse(s, &parsed);
    if (ok && parsed >= o.min && parsed <= o.max) {
      v = parsed;
    } else {
      complain("brisk: ignoring an invalid value of ", o.env);
    }
  }
  g_env[i].store(v == kUnset ? kUnsetStored : v + kBias, std::memory_order_relaxed);
  return v;
}

bool same(const char* a, const char* b) { return __builtin_strcmp(a, b) == 0; }

}  // namespace

Strategy strategy() {
  int s = g_strategy.load(std::memory_order_relaxed);
  if (s != kStrategyUnread) return static_cast<Strategy>(s);
  s = static_cast<int>(Strategy::kBalanced);
  if (const char* e = platform::get_env("BRISK_STRATEGY")) {
    if (same(e, "speed")) s = static_cast<int>(Strategy::kSpeed);
    else if (same(e, "low-memory") || same(e, "low_memory")) s = static_cast<int>(Strategy::kLowMemory);
    else if (!same(e, "balanced")) complain("brisk: ignoring an invalid value of ", "BRISK_STRATEGY");
  }
  int expected = kStrategyUnread;
  // A brisk_set_strategy that ran meanwhile wins over the environment.
  if (!g_strategy.compare_exchange_strong(expected, s, std::memory_order_relaxed)) return static_cast<Strategy>(expected);
  return static_cast<Strategy>(s);
}

void read_environment() {
  for (unsigned i = 0; i < kOptionCount; ++i) env_value(i);
  strategy();
}

void set_strategy(Strategy s) {
  g_strategy.store(static_cast<int>(s), std::memory_order_relaxed);
  drop_kept_values();
}

void drop_kept_values() {
  g_epoch.fetch_add(1, std::memory_order_release);
  // Last: any value resolved before this point is dropped (see get_slow). An exchange, not a
  // store: with two switches at once, each drop continues the release sequence of the other's
  // bump in the C++ memory model.
  for (auto& v : g_value) v.exchange(kUnresolved, std::memory_order_acq_rel);
}

std::int64_t get_for(Id id, Strategy s) {
  auto i = static_cast<unsigned>(id);
  std::int64_t v = env_value(i);
  return v != kUnset ? v : kTable[i].by_strategy[static_cast<int>(s)];
}

constinit std::atomic<std::int64_t> g_value[kOptionCount] = {};  // all kUnresolved

// Resolves id under the strategy in force and keeps the value, unless set_strategy ran
// meanwhile. set_strategy stores the strategy, bumps the epoch, then drops every kept value: a
// value kept before that drop is dropped; one kept after it was computed after the epoch moved
// (the compare-and-swap read the drop, which the bump happens before), so an unchanged epoch
// around the computation means it used the new strategy. get() may still return an old
// strategy's value for a moment (between such a compare-and-swap and its undo), so nothing
// caches get()'s answer against the epoch (heap_refresh_levers_slow uses get_for). A fork
// child drops every kept value (atfork_child): a fork inside a switch or inside that moment
// would leave it one that no switch comes to drop.
std::int64_t get_slow(Id id) {
  auto i = static_cast<unsigned>(id);
  for (;;) {
    const std::uint32_t before = g_epoch.load(std::memory_order_acquire);
    const std::int64_t v = get_for(id, strategy());
    std::int64_t expected = kUnresolved;
    g_value[i].compare_exchange_strong(expected, v + 1, std::memory_order_acq_rel, std::memory_order_acquire);
    if (g_epoch.load(std::memory_order_acquire) == before) return v;
    // A switch ran meanwhile: what was kept may be the old strategy's.
    expected = v + 1;
    g_value[i].compare_exchange_strong(expected, kUnresolved, std::memory_order_acq_rel, std::memory_order_relaxed);
  }
}

}  // namespace brisk::options
