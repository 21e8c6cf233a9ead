// Stack traces for debug blocks: capture, a depot that stores each distinct stack once, and
// symbolisation for reports.
//
// Interface for the debug layer's integration:
//   stack_trace_init()                  finds libgcc's unwinder (dlsym, else dlopen of
//                                       libgcc_s.so.1). Both may call malloc: call it once at
//                                       debug-mode start, outside every allocator lock. False if
//                                       no unwinder was found (captures then return 0 frames).
//   capture_stack(frames, max, skip)    the calling thread's return addresses, innermost first,
//                                       skipping `skip` callers of capture_stack. No malloc, no
//                                       lock; works without frame pointers (DWARF CFI unwinding,
//                                       through a cache of each return address's frame size on
//                                       x86-64: stack_trace.cc).
//   capture_stack(..., memo, &same)     the same through a WalkMemo the calling thread keeps (one
//                                       per call site): same is true when the frames are exactly
//                                       those of the memo's last walk, so that memo->value (the
//                                       caller's, e.g. a depot id) still holds for them; frames
//                                       may then be left unwritten. A capture that starts where
//                                       the memo's last walk did replays it: it compares the
//                                       stack words that walk read instead of walking.
//   capture_stack_unwound(...)          the same through the unwinder alone (tests compare).
//   capture_counts()                    this thread's captures served by the frame cache (and of
//                                       those, by a memo's replay), and by the unwinder after a
//                                       cache miss.
//   StackDepot                          stores a stack once and names it by a 32-bit id; bounded
//                                       (a full depot returns kNoStack and counts the drop).
//                                       Lock-free: any thread may store and fetch at any time.
//   format_frame(pc, out, capacity)     "module+0xoffset (symbol+0xoffset)", or
//                                       "module+0xoffset" without a symbol (dladdr), so addr2line
//                                       -e module 0xoffset names the line. Never mallocs.
//
// Frames are return addresses; format_frame prints the offset of pc - 1, the call instruction's
// last byte, so addr2line names the calling line and not the next one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace brisk::debug {

inline constexpr int kMaxStackDepth = 64;
inline constexpr std::uint32_t kNoStack = 0;

bool stack_trace_init();
int capture_stack(std::uintptr_t* frames, int max_depth, int skip);

// A thread's record of its last walk from one call site: each level's return address and its
// frame-cache entry (stack_trace.cc). A walk through the same return addresses reads their
// entries here, in memory only this thread touches, instead of probing the shared cache, whose
// slots a busy program keeps evicting from the CPU's caches (perf, MMtest small with 8 frames:
// a third of capture_stack's samples on those loads). Only one thread may use a memo at a time.
struct WalkMemo {
  static constexpr int kLevels = 16;
  std::uintptr_t pc[kLevels];
  std::uint64_t info[kLevels];
  std::uint64_t epoch = 0;  // the frame cache's epoch when the entries were read; 0: empty
  int levels = 0;           // return addresses the last walk read; 0: it did not end in the cache
  int max_depth = 0;        // and its arguments
  int skip = 0;
  std::uint32_t value = 0;  // the caller's, derived from the last walk's frames
  // The last walk's replay (walk_cached): every stack word it loaded, in order, and where.
  static constexpr int kLoads = 32;
  std::uintptr_t load_at[kLoads];
  std::uintptr_t loaded[kLoads];
  int loads = 0;
  int depth = 0;                   // the frames it found (pc[skip], pc[skip + 1], ...)
  std::uintptr_t replay_cfa = 0;   // where it started; 0: no replay recorded
  std::uintptr_t replay_rbp = 0;   // the RBP it started with, compared when replay_uses_rbp
  bool replay_uses_rbp = false;
};
// Through memo: *same says that the frames are the memo's last capture's, and then frames may
// be left unwritten (the caller reuses what it made of those: WalkMemo::value).
int capture_stack(std::uintptr_t* frames, int max_depth, int skip, WalkMemo* memo, bool* same);
int capture_stack_unwound(std::uintptr_t* frames, int max_depth, int skip);
struct CaptureCounts {
  std::uint64_t cached;
  std::uint64_t unwound;
  std::uint64_t replayed;  // of the cached: a memo's last walk replayed (walk_cached)
};
CaptureCounts capture_counts();
std::size_t format_frame(std::uintptr_t pc, char* out, std::size_t capacity);

class StackDepot {
 public:
  // Maps a table for max_stacks stacks and an arena of arena_bytes from core/platform (lazily
  // committed: untouched pages stay non-resident). False if mapping failed. Call once.
  bool init(std::uint32_t max_stacks, std::size_t arena_bytes);
  // The id of this stack, storing it if new. kNoStack for depth 0 or a full depot.
  std::uint32_t store(const std::uintptr_t* frames, int depth);
  // The stack of an id store returned: its depth, and *frames pointing into the depot.
  int fetch(std::uint32_t id, const std::uintptr_t** frames) const;

  std::size_t stored() const { return stored_.load(std::memory_order_relaxed); }
  std::size_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  std::size_t mapped_bytes() const { return table_bytes_ + arena_bytes_; }

 private:
  // A record in the arena, 8-byte aligned: hash, depth, then depth frames.
  struct Record {
    std::uint32_t hash;
    std::uint32_t depth;
    std::uintptr_t frames[];
  };
  const Record* record(std::uint32_t id) const;

  // Slot i holds an id (the record's arena offset in 8-byte words, plus 1) or 0 when empty.
  std::atomic<std::uint32_t>* table_ = nullptr;
  std::size_t slot_mask_ = 0;
  std::size_t table_bytes_ = 0;
  std::uint8_t* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::uint32_t max_stacks_ = 0;
  std::atomic<std::size_t> arena_used_{0};
  std::atomic<std::size_t> stored_{0};
  std::atomic<std::size_t> dropped_{0};
};

}  // namespace brisk::debug
