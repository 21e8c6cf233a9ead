// Debug blocks: what malloc hands out in debug mode, and everything that checks them.
//
// Layout of a debug block inside the block it is carved from (an underlying small or medium
// block of g_debug_heap, or a large block):
//   [slack for alignment][Header, 72 bytes][guard, 8 x kGuardByte][user data, user_size]
//   [canary, 8 x kGuardByte][rest of the underlying block]
// The header ends right at the user pointer, so header_of(p) reads p - kHeaderBytes. The
// guard catches an underrun, the canary right after the user data an overrun, both of one
// byte. A new block is filled with kAllocByte (calloc: zeroes), a freed one with kFreedByte,
// which is checked when the block leaves the quarantine.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace brisk::debug {

inline constexpr std::uint8_t kAllocByte = 0xA5;  // a new block (not calloc's)
inline constexpr std::uint8_t kFreedByte = 0xDD;  // a freed block, while in quarantine
inline constexpr std::uint8_t kGuardByte = 0xFD;  // the guard before and the canary after
// 8 bytes each side: a one-byte overrun or underrun lands in them either way, and every byte
// of a debug block's overhead counts in small blocks' footprint (a 64 B block takes the 160 B
// class with these and the 72-byte header, the 176 B one with 16-byte guards and 80).
inline constexpr std::size_t kGuardBytes = 8;
// Larger alignments (4 MiB and more) get release blocks even in debug mode: a debug block's
// header is found through the region map, which marks only the 4 MiB region where its large
// block starts, and a larger alignment could put the user pointer beyond that region.
inline constexpr std::size_t kMaxAlignment = std::size_t{2} << 20;

// How a block was allocated; a free must match it (free/delete/delete[]).
enum class Kind : std::uint8_t { kMalloc, kNew, kNewArray, kAligned };

// The kind of the allocation in progress on this thread: kMalloc, or what operator new's slow
// paths set (KindScope) around the shared ones, so the block made there records it.
extern __thread Kind t_alloc_kind __attribute__((tls_model("initial-exec")));
struct KindScope {
  Kind saved;
  explicit KindScope(Kind kind) : saved(t_alloc_kind) { t_alloc_kind = kind; }
  ~KindScope() { t_alloc_kind = saved; }
  KindScope(const KindScope&) = delete;
  KindScope& operator=(const KindScope&) = delete;
};

// Bytes at the start of the next debug block made on this thread that its caller overwrites at
// once (realloc's copy of the old block): the new pattern goes only past them. Set around the
// allocation by CopiedPrefixScope; allocate takes it (and clears it) before anything it calls
// can allocate, so an allocation made inside it never sees it. A signal handler that allocates
// between the two (undefined behaviour already) would take it: its block would then hold what
// its memory held before, not the new pattern, in the hint's first bytes.
extern __thread std::size_t t_copied_prefix __attribute__((tls_model("initial-exec")));
struct CopiedPrefixScope {
  explicit CopiedPrefixScope(std::size_t bytes) { t_copied_prefix = bytes; }
  ~CopiedPrefixScope() { t_copied_prefix = 0; }  // not taken: the block was a release block
  CopiedPrefixScope(const CopiedPrefixScope&) = delete;
  CopiedPrefixScope& operator=(const CopiedPrefixScope&) = delete;
};

// The debug block at user pointer p, live or in quarantine: true and its user size, or false
// when p is not one.
bool usable_size(const void* p, std::size_t* size);
// Where a block that realloc moves to grow is carved, so that its next steps can stay in place
// (realloc_in_place), as the entry layer places release blocks (override/entry.cc's
// grow_elsewhere): room, when above the size, is the user size the block it is carved from
// takes pages for (a medium run; ignored for small and large ones); large: from a large block,
// whatever its size, which grows into the cached space after its mapping.
struct Growth {
  std::size_t room = 0;
  bool large = false;
};
// nullptr with errno = ENOMEM on failure. alignment: a power of two, at most kMaxAlignment
// (larger alignments get release blocks: see allocate's caller).
void* allocate(std::size_t size, std::size_t alignment, Kind kind, bool zero, Growth growth = {});
// Frees a debug block, checking it (sized: the size the caller gave, kUnsized when none; 0 is a
// size, free_sized's of a malloc(0) block). False when p is not a debug block nor in a debug
// span: the caller treats it as a release block.
inline constexpr std::size_t kUnsized = SIZE_MAX;
bool release(void* p, Kind kind, std::size_t sized);
// Before realloc moves a block: kLive when p is a sound live debug block (*user_size: its
// size), now freed but in no list: the caller allocates the new block in the current mode,
// copies p's contents (still intact) and calls realloc_done(p, true), which frees p into the
// quarantine as a free would (through its heap's batch), or realloc_done(p, false) when it could not allocate (p is live again) or for
// realloc(p, 0) with true. A free of p meanwhile is a double free. kBad when p is a debug
// block or debug memory with a problem (reported; realloc fails with EINVAL), kNotDebug
// otherwise.
enum class ReallocCheck { kNotDebug, kLive, kBad };
ReallocCheck check_before_realloc(void* p, std::size_t* user_size);
// After kLive, before realloc_done: resizes p to size bytes where it lies, when the block it is
// carved from has room or grows in place (a medium run into the free pages after it, a large
// mapping into cached space or by mremap), and BRISK_DEBUG_REALLOC_MOVES is off. New bytes get
// the new pattern, the canary moves to the new end; realloc_done(p, false) then makes p live
// again with its new size. False: nothing changed, p is to be moved.
bool realloc_in_place(void* p, std::size_t size);
void realloc_done(void* p, bool moved);
// brisk_check_heap for the one debug block at p (live or quarantined): 1 if damaged (reported).
int check_block(const void* p);
// Checks every live and quarantined debug block; returns how many are damaged (each reported).
int check_heap();

// brisk_trim's part: every block in the quarantine and in the debug heaps' batches on their way
// to it leaves now, checked (damage is reported) and freed, as if pushed out. Returns how many.
std::size_t flush_quarantine();
// The background thread's part (DebugHooks::quarantine_idle): the blocks of the quarantine's
// shards that saw no push between two calls at least idle_ms apart leave, checked and freed;
// the batches of idle debug heaps join the quarantine. Returns how many left.
std::size_t leave_idle_quarantine(std::uint64_t now_ms, std::uint64_t idle_ms);
// Test hook, null in production: leave_idle_quarantine calls it before it takes any lock, so a
// test can park the background pass there and fork (tests/fork_heap_lock_test.cc).
extern std::atomic<void (*)()> g_idle_quarantine_test_hook;

// Reports live debug blocks grouped by allocation stack (count, sizes, total bytes), largest
// total first; returns the number of groups. Called at exit: BRISK_DEBUG_LEAKS=1 (the default)
// reports the blocks no pointer in the program's memory reaches any more (kUnreachable; every
// live block while other threads run, which the report says), 2 every live block (kAll), 0
// none. summary, if given: what was found (leaks.cc explains the reachability scan).
enum class LeakScope { kUnreachable, kAll };
struct LeakSummary {
  bool scanned;  // reachability was told (every other thread stopped or paused; the map was read)
  std::size_t threads_stopped;  // other threads stopped for the scan (ptrace; brisk-bg among them)
  std::size_t reported_blocks, reported_bytes;
  std::size_t reachable_blocks, reachable_bytes;  // not reported
};
int report_leaks(LeakScope scope, LeakSummary* summary = nullptr);

// BRISK_DEBUG_FILL_LIMIT: a block of up to this many user bytes gets the new and freed
// patterns, and the freed check, on every byte; a larger one on its first and last
// kFillEdgeBytes only (its guard, canary and header are checked whatever its size). init()
// reads the variable; tests set it here after init().
// An edge is one OS page: a stale pointer's write lands near the block's start, a short copy
// shows in its last bytes, and the patterns are written twice and checked once per block, so
// an edge's size is paid three times on every large allocation (32 KiB edges made MMtest's
// large-raw, whose 10..100 MiB blocks the program never touches, 30x release brisk, two
// thirds of it in memset and the check).
inline constexpr std::size_t kFillEdgeBytes = 4096;
void set_fill_limit(std::size_t bytes);

// BRISK_DEBUG_REALLOC_MOVES: true moves every block realloc is asked to resize (see
// realloc_in_place). init() reads the variable; tests set it here after init().
void set_realloc_moves(bool moves);

// BRISK_DEBUG_ACTION: false (abort, the default) aborts after a report; true (report) goes on,
// never reusing a damaged block. init() reads the variable; tests set it here after init().
void set_keep_going(bool keep_going);

// Maps the quarantine, the stack depot, reads the options; installs the thread cache's hooks.
// Idempotent; call outside every allocator lock (stack_trace_init may call malloc).
void init();

}  // namespace brisk::debug
