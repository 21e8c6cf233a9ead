// Debug blocks: layout in block.h, the header in block_layout.h. Small and medium ones are
// carved from blocks of the calling thread's debug heap (debug/debug_heap.h), without a lock;
// large ones from large blocks. Each block is on the live list of the debug heap that made it,
// under that heap's lock. Problems are reported outside every lock: a report callback may
// allocate. The leak report at exit is in leaks.cc, realloc in realloc.cc; what they share with
// this file, block_ops.h.
#include "debug/block.h"

#include <errno.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/chunk.h"
#include "core/config.h"
#include "core/hints.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/size_class.h"
#include "debug/block_layout.h"
#include "debug/block_ops.h"
#include "debug/debug_heap.h"
#include "debug/fill_check.h"
#include "debug/quarantine.h"
#include "debug/report.h"
#include "debug/snapshot.h"
#include "debug/stack_trace.h"
#include "core/text_writer.h"
#include "threadcache/debug_switch.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"

namespace brisk::debug {
__thread Kind t_alloc_kind __attribute__((tls_model("initial-exec"))) = Kind::kMalloc;
__thread std::size_t t_copied_prefix __attribute__((tls_model("initial-exec"))) = 0;
StackDepot g_depot;
std::atomic<int> g_init_state{0};
Quarantine g_quarantine;

// block_ops.h's state.
std::atomic<std::uint32_t> g_thread_numbers{0};
__thread std::uint32_t t_thread_number __attribute__((tls_model("initial-exec"))) = 0;
int g_stack_depth = 0;
std::atomic<std::size_t> g_fill_limit{std::size_t{1} << 20};  // options.cc's default, until init()
std::atomic<bool> g_realloc_moves{false};

// skip: callers of capture to leave out. The entry points reach allocate and release through
// tail jumps, so how many brisk frames sit above the caller's varies by path: the stack keeps
// them rather than risk dropping the caller's own frame. Not inlined, so that skip counts
// capture_walk's own frame and nothing else.
BRISK_NOINLINE std::uint32_t capture_walk(int skip, Site site) {
  std::uintptr_t frames[kMaxStackDepth];
  Heap* th = t_heap;
  auto* d = heap_is_attached(th) ? static_cast<DebugHeap*>(th->debug) : nullptr;
  // A capture inside this one (the unwinder may call malloc, for frames registered at run
  // time) walks without the memos: it would leave its walk in a memo this capture then gives
  // its own id.
  if (d != nullptr && d->capturing) d = nullptr;
  WalkMemo* memo = d != nullptr ? &d->walks[static_cast<unsigned>(site)] : nullptr;
  static_assert(sizeof(d->walks) / sizeof(d->walks[0]) == 3, "one memo per Site");
  if (d != nullptr) d->capturing = true;
  bool same = false;
  int n = capture_stack(frames, g_stack_depth, skip + 1, memo, &same);
  // Same frames as the memo's last walk: the id stored for them then (the depot keeps every
  // stack it stored, so the id still names them).
  std::uint32_t id = same ? memo->value : g_depot.store(frames, n);
  if (d != nullptr) {
    memo->value = id;
    d->capturing = false;
  }
  return id;
}

// header_of's part for a pointer into a large block's first region (kind: its region byte).
BRISK_NOINLINE Header* large_header_from(std::uintptr_t a, std::uint8_t kind, bool* in_debug_memory) {
  // A large block's start is where its region byte says; a debug block's user pointer lies
  // past its header, before the block's end (past it, the region may be unmapped). Any
  // pointer into a large block carved for a debug block is debug memory (its first word says
  // so); pointers past the block's first region have no region byte to lead here.
  if (!region_is_large(kind)) return nullptr;
  std::uintptr_t start = (a & ~kChunkMask) + region_large_offset(kind);
  LargeHeader* lh = large_header_of(reinterpret_cast<void*>(start), kind);
  if (lh == nullptr || a < start || a - start >= large_usable_size(reinterpret_cast<void*>(start), lh)) return nullptr;
  if (!underlying_is_debug_block(start)) return nullptr;
  *in_debug_memory = true;
  if (a % kMinAlign != 0 || a < start + kHeaderBytes) return nullptr;
  return reinterpret_cast<Header*>(a - kHeaderBytes);
}

Header* header_of(const void* p, bool* in_debug_memory, DebugHeap** heap) {
  return find_header(p, in_debug_memory, heap);
}

constexpr const char* kDamagedHeader = "damaged header (an underrun, or a write through a stale pointer)";
constexpr const char* kWriteAfterFreeFound = "write after free (found by brisk_check_heap)";

// The debug heap whose live_lock guards block h, read where the program cannot have damaged it
// when possible: for a block in a chunk, its span's owner (the debug heap that made it, since a
// debug heap keeps every span that holds one of its blocks); for a large block, the debug heap
// whose id the header holds, if there is one. nullptr: the header is damaged.
DebugHeap* heap_of(const Header* h) {
  auto a = reinterpret_cast<std::uintptr_t>(h);
  if (region_kind(a) == kRegionChunk) {
    Heap* owner = chunk_of(a)->span_of(a)->owner.load(std::memory_order_acquire);
    return owner != nullptr && owner->is_debug ? static_cast<DebugHeap*>(owner) : nullptr;
  }
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next)
    if (d->id == h->heap_id) return d;
  return nullptr;
}

// What is wrong with a live block's own bytes (header, guard, canary), or nullptr. *mix, when
// asked for: the header's mix_of as read, verified against its checksum unless the header is
// the problem (mark_freed's input either way).
const char* damage_of(const Header* h, FillDamage* damage, std::uint64_t* mix) {
  const std::uint64_t m = mix_of(h);
  if (mix != nullptr) *mix = m;
  if (mix_checksum(m) != h->checksum) {
    damage->first_offset = 0;
    damage->range_count = 0;
    damage->more_ranges = false;
    return kDamagedHeader;
  }
  if (!check_fill(h->guard, kGuardBytes, kGuardByte, damage)) {
    // Offsets relative to the user pointer would be negative: name them from the guard's start.
    return "underrun: the guard bytes before the block were written";
  }
  if (!check_fill(user_of(h) + h->user_size, kGuardBytes, kGuardByte, damage)) {
    for (int i = 0; i < damage->range_count; ++i) damage->ranges[i].offset += h->user_size;
    damage->first_offset += h->user_size;
    return "overrun: the canary after the block was written";
  }
  return nullptr;
}

namespace {

// Calls part(offset, length) for each part of a block's user data that carries its fill
// pattern: all of it, or its two edges. Always inlined: out of line, GCC passed the fill's
// lambda through the stack, written as two narrow stores and read back as one 16-byte load,
// which cannot be forwarded from them (perf on sh6bench in debug mode: a third of the
// allocation's and of the free's samples on the instructions after that load).
template <class Part>
[[gnu::always_inline]] inline void for_each_filled_part(const Header* h, Part part) {
  if (!h->edges_only) {
    part(std::size_t{0}, static_cast<std::size_t>(h->user_size));
    return;
  }
  part(std::size_t{0}, kFillEdgeBytes);
  part(h->user_size - kFillEdgeBytes, kFillEdgeBytes);
}

}  // namespace

// fill_user's general case: a block filled on its edges only, or from byte `from` on.
BRISK_NOINLINE void fill_user_parts(Header* h, std::uint8_t byte, std::size_t from) {
  for_each_filled_part(h, [h, byte, from](std::size_t offset, std::size_t length) {
    if (offset + length <= from) return;
    if (offset < from) {
      length -= from - offset;
      offset = from;
    }
    fill_block(user_of(h) + offset, length, byte);
  });
}

namespace {

// freed_pattern_intact's general case: a block filled on its edges only, or a damaged one.
BRISK_NOINLINE bool freed_pattern_checked(const Header* h, FillDamage* damage) {
  bool intact = true;
  for_each_filled_part(h, [h, damage, &intact](std::size_t offset, std::size_t length) {
    FillDamage part;
    if (check_fill(user_of(h) + offset, length, kFreedByte, &part)) return;
    if (intact) {
      damage->first_offset = part.first_offset + offset;
      damage->range_count = 0;
      damage->more_ranges = false;
      intact = false;
    }
    for (int i = 0; i < part.range_count; ++i) {
      if (damage->range_count == kMaxDamagedRanges) {
        damage->more_ranges = true;
        return;
      }
      damage->ranges[damage->range_count++] = {part.ranges[i].offset + offset, part.ranges[i].length};
    }
    damage->more_ranges |= part.more_ranges;
  });
  return intact;
}

// Whether the filled parts of a freed block still hold the freed pattern; else *damage, with
// offsets from the user pointer. The common case inline, with no lambda and no damage record:
// a whole block found intact by one compare (inline up to 64 bytes).
BRISK_ALWAYS_INLINE bool freed_pattern_intact(const Header* h, FillDamage* damage) {
  if (BRISK_LIKELY(!h->edges_only) &&
      BRISK_LIKELY(find_fill_damage(user_of(h), h->user_size, kFreedByte) == h->user_size))
    return true;
  return freed_pattern_checked(h, damage);
}

}  // namespace

// What is wrong with a quarantined block, or nullptr: its header, guard or canary first (a
// damaged header's size cannot be trusted to check the pattern with), then its freed pattern.
const char* quarantined_damage(const Header* h, FillDamage* damage) {
  if (const char* problem = damage_of(h, damage)) return problem;
  return freed_pattern_intact(h, damage) ? nullptr : kWriteAfterFreeFound;
}

// A block whose header names no debug heap: reported, and left where it is (no lock guards it,
// so neither its state nor any list is touched).
void header_damaged(const Header* h) {
  Snapshot s;
  take_snapshot(&s, kDamagedHeader, h, nullptr);
  problem_found(s);
}

namespace {

// Gives the block's memory back to its heap (or the OS). The block is in no list.
BRISK_ALWAYS_INLINE void free_underlying(Header* h) {
  char* u = underlying_of(h);
  store_check(h, 0);
  auto a = reinterpret_cast<std::uintptr_t>(u);
  if (h->underlying_offset != 0) first_word(a).store(0, std::memory_order_relaxed);  // kSlackMagic's
  std::uint8_t kind = region_kind(a);
  if (kind == kRegionChunk) {
    free_in_debug_heap(u);
    return;
  }
  large_free(u, large_header_of(u, kind));
}

// A block out of the quarantine: its freed pattern, and its header, guard and canary (a write
// after free may land there too), are checked before its memory is reused. No thread writes a
// quarantined block's header meanwhile (a double free or a check only reads it).
BRISK_ALWAYS_INLINE void leave_quarantine(Header* h) {
  FillDamage damage;
  const char* problem = BRISK_LIKELY(edges_intact(h, mix_of(h))) ? nullptr : damage_of(h, &damage);
  if (problem == nullptr) {
    if (freed_pattern_intact(h, &damage)) {
      free_underlying(h);
      return;
    }
    problem = "write after free: the freed block was written while in quarantine";
  }
  DebugHeap* d = heap_of(h);
  if (d == nullptr) return header_damaged(h);
  Snapshot s;
  {
    LiveLock g(d);
    take_snapshot(&s, problem, h, &damage);
    h->state = State::kKept;  // never reused
    seal(h);
  }
  problem_found(s);
}

// out holds n blocks that push or take_excess took out, with room for kEvictBatch: only a full
// batch can leave more behind, so only then is the shard's lock taken again. Room for a debug
// heap's whole batch and one more block (release): push takes out up to one block per block.
static_assert(kEvictBatch >= DebugHeap::kFreedBatch + 1);
BRISK_ALWAYS_INLINE void drain_evicted(QuarantinedBlock* out, std::size_t n) {
  for (;;) {
    for (std::size_t i = 0; i < n; ++i) leave_quarantine(static_cast<Header*>(out[i].block));
    if (n < kEvictBatch) return;
    n = g_quarantine.take_excess(out, kEvictBatch);
  }
}

void* hook_alloc(std::size_t size);  // below, with allocate
bool hook_free(void* p) { return release(p, Kind::kMalloc, kUnsized); }
void install_hooks();  // below, with the fork handlers

}  // namespace

const char* kind_mismatch(Kind allocated, Kind freed) {
  if (kinds_match(allocated, freed)) return nullptr;
  switch (allocated) {
    case Kind::kNew: return freed == Kind::kNewArray ? "delete[] of a block made by new" : "free of a block made by new";
    case Kind::kNewArray: return freed == Kind::kNew ? "delete of a block made by new[]" : "free of a block made by new[]";
    default: return freed == Kind::kNew ? "delete of a block made by malloc" : "delete[] of a block made by malloc";
  }
}

void init() {
  if (g_init_state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (!g_init_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    while (g_init_state.load(std::memory_order_acquire) != 2) sched_yield();
    return;
  }
  process_init();
  platform::keep_stderr();  // the reports at exit reach the stderr the program started with
  g_stack_depth = static_cast<int>(options::get(options::Id::kDebugStackDepth));
  if (g_stack_depth > 0) {
    stack_trace_init();
    g_depot.init(1u << 16, std::size_t{64} << 20);
  }
  g_keep_going.store(options::get(options::Id::kDebugAction) == 1, std::memory_order_relaxed);
  g_fill_limit.store(static_cast<std::size_t>(options::get(options::Id::kDebugFillLimit)), std::memory_order_relaxed);
  g_realloc_moves.store(options::get(options::Id::kDebugReallocMoves) != 0, std::memory_order_relaxed);
  g_quarantine.init(Quarantine::default_budget(), 1u << 16);
  fill_check_init();
  // Installed at load already, unless this runs in a constructor before debug/'s.
  if (g_debug_hooks.alloc == nullptr) install_hooks();
  g_debug_blocks_may_exist.store(true, std::memory_order_release);
  g_init_state.store(2, std::memory_order_release);
}

void set_keep_going(bool keep_going) { g_keep_going.store(keep_going, std::memory_order_relaxed); }
void set_fill_limit(std::size_t bytes) { g_fill_limit.store(bytes, std::memory_order_relaxed); }
void set_realloc_moves(bool moves) { g_realloc_moves.store(moves, std::memory_order_relaxed); }

namespace {

// Runs make with the calling thread's debug heap: its thread heap's (the thread gets a heap now
// if it has none yet), or, on a thread that has exited, a borrowed heap's, given back after.
// nullptr when there is no memory for a heap.
template <class Make>
void* with_debug_heap(Make make) {
  Heap* h = t_heap;
  if (h == &g_exited_heap) {
    return alloc_with_borrowed_heap([&make](Heap* borrowed) -> void* {
      DebugHeap* d = debug_heap_of(borrowed);
      return d != nullptr ? make(d) : nullptr;
    });
  }
  if (h == &g_sentinel_heap) h = heap_for_this_thread();
  if (h == nullptr) return nullptr;
  DebugHeap* d = debug_heap_of(h);
  return d != nullptr ? make(d) : nullptr;
}

}  // namespace

// A large block for a debug block. A mapping the OS refuses (address space, commit limit)
// gets what release mode's large_alloc_here gives it, and the quarantine's blocks too: their
// spans and mappings go back with a trim (as brisk_trim), then one more try.
void* large_debug_block(std::size_t total, bool zero, bool grows) {
  if (void* u = large_alloc(total, kMinAlign, zero, nullptr, grows)) return u;
  flush_quarantine();
  if (process_trim() == 0) return nullptr;
  return large_alloc(total, kMinAlign, zero, nullptr, grows);
}

namespace {

// allocate's work in d, the calling thread's debug heap (its spans are used without a lock):
// the underlying block, then the header, the patterns and the check word.
BRISK_ALWAYS_INLINE void* make_block(DebugHeap* d, std::size_t size, std::size_t alignment, Kind kind, bool zero,
                                     Growth growth, std::size_t copied, std::uint32_t stack) {
  // Underlying small and medium blocks are 16-byte aligned at least: alignment - 16 bytes of
  // slack always leave room to align the user pointer.
  const std::size_t total = kHeaderBytes + (alignment - kMinAlign) + size + kGuardBytes;
  // With room: the run takes pages for the room too (within kMediumMax), untouched until the
  // block grows into them.
  const std::size_t room = growth.room > size ? total + (growth.room - size) : 0;
  void* u = growth.large || total > kMediumMax
                ? large_debug_block(total, zero, growth.large)  // total has the slack
            : total <= kSmallMax ? alloc_small(d, size_to_class(total), total)
                                 : alloc_medium(d, total, false, room < kMediumMax ? room : kMediumMax);
  if (u == nullptr) return nullptr;
  auto ua = reinterpret_cast<std::uintptr_t>(u);
  std::uintptr_t a = (ua + kHeaderBytes + alignment - 1) & ~(alignment - 1);
  auto* h = reinterpret_cast<Header*>(a - kHeaderBytes);
  static_assert(kMaxAlignment - kMinAlign <= UINT32_MAX, "underlying_offset holds the alignment slack");
  const auto offset = static_cast<std::uint32_t>(reinterpret_cast<char*>(h) - static_cast<char*>(u));
  const std::uint64_t sequence = ++d->sequence;
  const std::uint32_t thread = thread_number();
  const bool edges_only = fill_edges_only(size);
  h->heap_id = d->id;
  h->underlying_offset = offset;
  h->user_size = size;
  h->sequence = sequence;
  h->alloc_thread = thread;
  h->free_thread = 0;
  h->alloc_stack = stack;
  h->free_stack = kNoStack;
  h->kind = kind;
  h->state = State::kLive;
  h->edges_only = edges_only;
  h->reserved = 0;
  std::memset(h->guard, kGuardByte, kGuardBytes);
  // Sealed from the values just stored (block_layout.h: not loaded back).
  h->checksum = mix_checksum(mix_words(size, sequence, pair_word(thread, 0), pair_word(stack, kNoStack),
                                       pair_word(d->id, offset), flags_word(kind, State::kLive, edges_only, 0)));
  BRISK_ASSERT(h->checksum == checksum_of(h));
  if (!zero) fill_user(h, kAllocByte, copied);
  else if (!growth.large && total <= kMediumMax) std::memset(user_of(h), 0, size);  // large_alloc zeroed the rest
  std::memset(user_of(h) + size, kGuardByte, kGuardBytes);
  store_check(h, kMagic ^ a);
  if (ua != reinterpret_cast<std::uintptr_t>(h)) first_word(ua).store(kSlackMagic ^ ua, std::memory_order_relaxed);
  add_made(d, h);
  return user_of(h);
}

// make_block for a thread without a debug heap yet, or without a heap (one is made), or past its
// exit (a borrowed heap's).
BRISK_NOINLINE void* make_block_elsewhere(std::size_t size, std::size_t alignment, Kind kind, bool zero,
                                          Growth growth, std::size_t copied, std::uint32_t stack) {
  return with_debug_heap([&](DebugHeap* d) { return make_block(d, size, alignment, kind, zero, growth, copied, stack); });
}

// The calling thread's debug heap when it has one (the common case), else nullptr.
BRISK_ALWAYS_INLINE DebugHeap* own_debug_heap() {
  Heap* h = t_heap;
  if (h == &g_exited_heap || h == &g_sentinel_heap) return nullptr;
  return static_cast<DebugHeap*>(h->debug);
}

BRISK_ALWAYS_INLINE void* allocate_inline(std::size_t size, std::size_t alignment, Kind kind, bool zero, Growth growth) {
  // Callers come here once debug_mode_on() read the mode on, whose acquire orders init's writes
  // before this thread's reads of them (debug_switch.h); the other ways into debug/ (free,
  // realloc, usable size) come through g_debug_blocks_may_exist's acquire.
  BRISK_ASSERT(g_init_state.load(std::memory_order_relaxed) == 2);
  if (alignment < kMinAlign) alignment = kMinAlign;
  constexpr std::size_t kLimit = static_cast<std::size_t>(PTRDIFF_MAX) / 2;
  if (BRISK_UNLIKELY(size > kLimit)) {
    errno = ENOMEM;
    return nullptr;
  }
  // Taken before capture, which may allocate.
  const std::size_t copied = t_copied_prefix;
  t_copied_prefix = 0;
  std::uint32_t stack = capture(0, Site::kAllocate);
  if (g_realloc_moves.load(std::memory_order_relaxed)) growth = Growth{};  // no block grows where it is
  DebugHeap* d = own_debug_heap();
  void* user = BRISK_LIKELY(d != nullptr) ? make_block(d, size, alignment, kind, zero, growth, copied, stack)
                                          : make_block_elsewhere(size, alignment, kind, zero, growth, copied, stack);
  if (BRISK_UNLIKELY(user == nullptr)) errno = ENOMEM;
  return user;
}

}  // namespace

void* allocate(std::size_t size, std::size_t alignment, Kind kind, bool zero, Growth growth) {
  return allocate_inline(size, alignment, kind, zero, growth);
}

namespace {
// The allocation hook of debug mode (debug_switch.h): allocate for malloc and new, inline.
void* hook_alloc(std::size_t size) { return allocate_inline(size, kMinAlign, t_alloc_kind, false, Growth{}); }
}  // namespace

bool usable_size(const void* p, std::size_t* size) {
  bool in_debug_memory;
  DebugHeap* d;
  Header* h = header_of(p, &in_debug_memory, &d);
  if (h == nullptr) {
    if (in_debug_memory) problem_at("usable size of a pointer that is no debug block", p);
    if (in_debug_memory) *size = 0;
    return in_debug_memory;
  }
  *size = 0;
  if (d == nullptr) {
    header_damaged(h);
    return true;
  }
  // A freed block (quarantined or kept) is reported as release mode reports a free small block,
  // with the stacks of its allocation and free; 0 when the program goes on.
  Snapshot s;
  {
    LiveLock g(d);
    if (h->state == State::kLive) *size = h->user_size;
    else take_snapshot(&s, "malloc_usable_size of a freed block (a use after free)", h, nullptr);
  }
  if (s.problem != nullptr) problem_found(s);
  return true;
}

void push_to_quarantine(const QuarantinedBlock* blocks, std::size_t n) {
  QuarantinedBlock evicted[kEvictBatch];
  drain_evicted(evicted, g_quarantine.push(blocks, n, evicted, kEvictBatch));
}

void leave_quarantine_all(const QuarantinedBlock* blocks, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) leave_quarantine(static_cast<Header*>(blocks[i].block));
}

namespace {

// release of a pointer header_of placed in no debug heap: h nullptr (no debug block starts at
// p), or h with a header that names no debug heap.
BRISK_NOINLINE bool release_unplaced(const void* p, const Header* h, bool in_debug_memory) {
  if (h == nullptr) {
    if (!in_debug_memory) return false;
    problem_at("invalid free: no debug block starts here (a pointer inside a block, or freed long ago)", p);
    return true;
  }
  header_damaged(h);
  return true;
}

// release of a block that its fast path found not to be live, intact and freed by a function of
// its kind and size: every case decided again under the lock (what is found now decides, if
// another thread freed it meanwhile), and reported after it.
BRISK_NOINLINE bool release_checked(DebugHeap* d, Header* h, Kind kind, std::size_t sized, std::uint32_t stack) {
  Snapshot s;
  bool keep = false;  // a double free, or a damaged block: it does not go to the quarantine
  bool batched = false;
  QuarantinedBlock out[DebugHeap::kFreedBatch + 1];  // d's batch, taken out, then h unless batched
  std::size_t n = 0;
  {
    LiveLock g(d);
    FillDamage damage;
    std::uint64_t mix;
    if (h->state == State::kKept) {
      // Reported already (damaged, or refused by realloc, after which C lets the program free
      // it): it stays where it is, never reused.
      keep = true;
      take_snapshot(&s, "free of a block kept after an earlier report (damaged: never reused)", h, nullptr);
    } else if (h->state != State::kLive) {
      keep = true;
      take_snapshot(&s, "double free", h, nullptr);
    } else if (const char* problem = damage_of(h, &damage, &mix)) {
      keep = true;
      mark_freed(d, h, mix, stack, State::kKept);  // never reused
      take_snapshot(&s, problem, h, &damage);
    } else {
      const char* misuse = kind_mismatch(h->kind, kind);
      if (misuse == nullptr && sized != kUnsized && sized != h->user_size)
        misuse = "sized free with a size that is not the block's";
      mark_freed(d, h, mix, stack, State::kQuarantined);
      if (misuse != nullptr) take_snapshot(&s, misuse, h, nullptr);
      else batched = batch_freed(d, h, out, &n);
    }
  }
  if (s.problem != nullptr) problem_found(s);
  if (keep) return true;
  return quarantine_released(h, batched, out, n);
}

}  // namespace

bool release(void* p, Kind kind, std::size_t sized) {
  bool in_debug_memory;
  DebugHeap* d;
  Header* h = find_header(p, &in_debug_memory, &d);
  if (BRISK_UNLIKELY(h == nullptr || d == nullptr)) return release_unplaced(p, h, in_debug_memory);
  const std::uint32_t stack = capture(0, Site::kRelease);
  bool plain;
  bool batched = false;
  QuarantinedBlock out[DebugHeap::kFreedBatch + 1];  // d's batch, taken out, then h unless batched
  std::size_t n = 0;
  {
    LiveLock g(d);
    // The common case, inline and without a report's snapshot: a live, intact block freed by a
    // function of its kind and size. Anything else is release_checked's.
    std::uint64_t mix;
    plain = live_and_intact(h, &mix) && kinds_match(h->kind, kind) && (sized == kUnsized || sized == h->user_size);
    if (BRISK_LIKELY(plain)) {
      mark_freed(d, h, mix, stack, State::kQuarantined);
      batched = batch_freed(d, h, out, &n);
    }
  }
  if (BRISK_UNLIKELY(!plain)) return release_checked(d, h, kind, sized, stack);
  return quarantine_released(h, batched, out, n);
}

namespace {

// fork: every lock of the debug layer, in this order, after the C library's stdio list lock.
// The heap check's lock has hooks of its own, taken before that (debug_switch.h): its holder
// runs report callbacks, which may allocate and so take the others, take stdio's locks, or fork
// (then the forking thread holds it, and it is left as it is, heap_check.cc). None of the
// others is held while another is taken, nor while a lock of the thread cache or core is.
void fork_prepare() {
  heaps_lock_all();
  g_quarantine.lock_all();
  report_sink_lock();
}
void fork_parent() {
  report_sink_unlock();
  g_quarantine.unlock_all();
  heaps_unlock_all();
}
void fork_child() {
  report_sink_reset_in_child();
  g_quarantine.reset_locks_in_child();
  heaps_reset_in_child();
}

void install_hooks() {
  g_debug_hooks = DebugHooks{hook_alloc,         hook_free,          fork_prepare,
                             fork_parent,        fork_child,         check_lock_acquire,
                             check_lock_release, check_lock_reset_in_child, leave_idle_quarantine};
}

// At load, before the program starts a thread: the fork handlers read the hooks without a lock,
// and must take the debug layer's locks from the first fork on. Priority 101, the first a
// program may use: in a static link the program's own constructors of default priority (which
// may start threads) and debug/mode.cc's (BRISK_DEBUG=1's enter) otherwise ran first, and init
// installed the hooks while other threads already allocated. Not a guarantee: a program's own
// priority-101 constructor, or another library's when brisk is preloaded, still runs before
// it; alloc_refill then reads the hooks after debug_mode_on()'s acquire all the same.
__attribute__((constructor(101))) void install_hooks_at_load() {
  if (g_debug_hooks.alloc == nullptr) install_hooks();
}

}  // namespace

}  // namespace brisk::debug
