// The operations on a debug block that its allocation, its free (block.cc) and its realloc
// (realloc.cc) share: finding its header from a user pointer, the checks of a free, marking it
// freed, its fill patterns, and its way into the quarantine. Internal to debug/; the header's
// layout is block_layout.h's. Always inlined: they are those paths' common case, where a call
// cost instructions (the comments below say where that was measured); their out-of-line parts
// are defined in block.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/chunk.h"
#include "core/config.h"
#include "core/hints.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "debug/fill_check.h"
#include "debug/quarantine.h"
#include "threadcache/heap.h"

namespace brisk::debug {

inline constexpr std::uint64_t kMagic = 0x6272697365646267ull;
// The first word of the block a debug block with alignment slack is carved from, xored with that
// block's address, while the debug block is live, quarantined or kept. Without slack the header
// starts there, its check word kMagic ^ (block + kHeaderBytes). Either way a pointer to the
// underlying block (the user pointer less the header and slack) is known for debug memory, not
// taken for a release block and freed under the debug block (underlying_is_debug_block).
inline constexpr std::uint64_t kSlackMagic = 0x62726973736c6b21ull;

inline constexpr std::size_t kHeaderBytes = sizeof(Header);
static_assert(kHeaderBytes == 80 && kHeaderBytes % kMinAlign == 0, "the user pointer must keep the header's alignment");
// A large debug block is a large block of default alignment, which starts one OS page into its
// 4 MiB region; its user pointer lies at most kHeaderBytes + kMaxAlignment - kMinAlign further
// on, so still in that region, the one whose region byte names the large block (header_of).
static_assert(kOsPageSize + kHeaderBytes + kMaxAlignment - kMinAlign < kChunkSize);

// Debug blocks' thread numbers (the header's alloc_thread and free_thread): 1, 2, ... in the
// order threads first make or free one.
extern std::atomic<std::uint32_t> g_thread_numbers;
extern __thread std::uint32_t t_thread_number __attribute__((tls_model("initial-exec")));
// BRISK_DEBUG_STACK_DEPTH, set by init.
extern int g_stack_depth;
// BRISK_DEBUG_FILL_LIMIT. Filling a 10-100 MiB block whole costs a page fault per 4 KiB page
// and two passes over it (MMtest's large test ran 82 s at 0.02% scale, against well under a
// second in release mode); its edges are where an overrun, a short copy or a stale pointer to
// its start land.
extern std::atomic<std::size_t> g_fill_limit;
extern std::atomic<bool> g_realloc_moves;  // BRISK_DEBUG_REALLOC_MOVES

BRISK_ALWAYS_INLINE std::uint32_t thread_number() {
  if (t_thread_number == 0) t_thread_number = g_thread_numbers.fetch_add(1, std::memory_order_relaxed) + 1;
  return t_thread_number;
}

// Where a stack is captured: each has its WalkMemo in the thread's debug heap.
enum class Site : unsigned { kAllocate = 0, kRelease = 1, kRealloc = 2 };

// The stack of the calling thread at a Site, stored in g_depot: its id (block.cc).
std::uint32_t capture_walk(int skip, Site site);

// The stack to record: none with stacks off (inlined: a call to learn that cost 10
// instructions twice per debug block), else capture_walk's (its skip counts its own frame
// only, so this wrapper must stay inlined).
BRISK_ALWAYS_INLINE std::uint32_t capture(int skip, Site site) {
  if (g_stack_depth == 0) return kNoStack;
  return capture_walk(skip, site);
}

BRISK_ALWAYS_INLINE std::uint64_t load_check(const Header* h) {
  return std::atomic_ref<std::uint64_t>(const_cast<Header*>(h)->check).load(std::memory_order_relaxed);
}
BRISK_ALWAYS_INLINE void store_check(Header* h, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(h->check).store(v, std::memory_order_relaxed);
}

BRISK_ALWAYS_INLINE std::atomic_ref<std::uint64_t> first_word(std::uintptr_t block) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(block));
}
// Whether the block brisk handed out at `block` (mapped: a block start of a span, or a live
// large block's start) is the underlying block of a debug block. Read as an atomic: when it is
// a release block, its owner may be reading or writing it (a free list's link) meanwhile.
BRISK_ALWAYS_INLINE bool underlying_is_debug_block(std::uintptr_t block) {
  const std::uint64_t w = first_word(block).load(std::memory_order_relaxed);
  return w == (kMagic ^ (block + kHeaderBytes)) || w == (kSlackMagic ^ block);
}

// The debug heap whose live_lock guards block h, or nullptr: its header is damaged (block.cc).
DebugHeap* heap_of(const Header* h);
// find_header's part for a pointer into a large block's first region (block.cc).
Header* large_header_from(std::uintptr_t a, std::uint8_t kind, bool* in_debug_memory);

// The debug block whose user pointer is p, or nullptr. *in_debug_memory: p lies in memory that
// holds debug blocks (so a failed lookup is a bad pointer, not a release block). *heap, with a
// block: heap_of(block), found on the way for a block in a chunk. Inline where a free or
// realloc needs it: a pointer into a chunk (a small or medium block) costs no call and no
// out-parameter in memory; large blocks go out of line. header_of is its called form.
BRISK_ALWAYS_INLINE Header* find_header(const void* p, bool* in_debug_memory, DebugHeap** heap) {
  *in_debug_memory = false;
  *heap = nullptr;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t kind = region_kind(a);
  Header* h;
  if (BRISK_LIKELY(kind == kRegionChunk)) {
    Span* s = chunk_of(a)->span_of(a);
    // Heaps are never unmapped: a racing owner change reads some heap's flag.
    Heap* owner = s->owner.load(std::memory_order_acquire);
    if (owner == nullptr || !owner->is_debug) return nullptr;
    std::uintptr_t offset = a - reinterpret_cast<std::uintptr_t>(s->start);
    // Debug heaps also take partly used spans from the central pools (spans of exited
    // threads), whose live release blocks are freed the release way: a block start is one of
    // those (or a double free the release checks catch), unless its first word shows it is a
    // debug block's underlying block (a pointer to the header, or to the alignment slack before
    // it). A debug block's user pointer never is a block start: it lies kHeaderBytes plus less
    // than its alignment into the block it is carved from, whose size is at least that plus the
    // user size and the canary. So nothing before a block start is read: those bytes are the
    // block before it, another thread's to write.
    if (s->is_block_start(offset)) {
      *in_debug_memory = underlying_is_debug_block(a);
      return nullptr;
    }
    *in_debug_memory = true;
    if (a % kMinAlign != 0 || offset < kHeaderBytes) return nullptr;
    // The header lies in the same span as p (both in the block it is carved from).
    *heap = static_cast<DebugHeap*>(owner);
    h = reinterpret_cast<Header*>(a - kHeaderBytes);
  } else {
    h = large_header_from(a, kind, in_debug_memory);
    if (h == nullptr) return nullptr;
  }
  if (load_check(h) != (kMagic ^ a)) {
    *heap = nullptr;
    return nullptr;
  }
  *in_debug_memory = true;
  if (*heap == nullptr) *heap = heap_of(h);
  return h;
}

// damage_of's finding nothing, inline (frees and quarantine exits, where it is the common case):
// the checksum over mix (mix_of(h) as read), then the guard and the canary, one compare each.
// The canary is read only once the checksum vouches for the user size.
BRISK_ALWAYS_INLINE bool edges_intact(const Header* h, std::uint64_t mix) {
  if (BRISK_UNLIKELY(mix_checksum(mix) != h->checksum)) return false;
  static_assert(kGuardBytes == 8, "the guard and the canary are one word each");
  constexpr std::uint64_t kGuardWord = 0x0101010101010101ull * kGuardByte;
  std::uint64_t guard, canary;
  std::memcpy(&guard, h->guard, 8);
  std::memcpy(&canary, user_of(h) + h->user_size, 8);
  return ((guard ^ kGuardWord) | (canary ^ kGuardWord)) == 0;
}

// Whether a block of this size gets its patterns on its edges only. Decided once, at
// allocation, and kept in the header: the limit may change while the block lives.
BRISK_ALWAYS_INLINE bool fill_edges_only(std::size_t user_size) {
  return user_size > g_fill_limit.load(std::memory_order_relaxed) && user_size > 2 * kFillEdgeBytes;
}

// fill_user's general case: a block filled on its edges only, or from byte `from` on (block.cc).
void fill_user_parts(Header* h, std::uint8_t byte, std::size_t from);

// The pattern over the filled parts of a block's user data from byte `from` on (the bytes
// before it are the caller's to write). Inline for the common case, a whole block.
BRISK_ALWAYS_INLINE void fill_user(Header* h, std::uint8_t byte, std::size_t from = 0) {
  if (BRISK_LIKELY(!h->edges_only && from == 0)) return fill_block(user_of(h), h->user_size, byte);
  fill_user_parts(h, byte, from);
}

BRISK_ALWAYS_INLINE bool kinds_match(Kind allocated, Kind freed) {
  auto family = [](Kind k) { return k == Kind::kAligned ? Kind::kMalloc : k; };
  return family(allocated) == family(freed);
}

// The report's words for a free by a function of another kind than the block's, or nullptr.
const char* kind_mismatch(Kind allocated, Kind freed);

// A live block freed by this thread (d->live_lock held): out of the live list, into `state`.
// mix: the header's mix_of as it is, verified against its checksum (by edges_intact or
// damage_of): the new checksum is that mix with the free's fields changed.
BRISK_ALWAYS_INLINE void mark_freed(DebugHeap* d, Header* h, std::uint64_t mix, std::uint32_t stack, State state) {
  BRISK_ASSERT(d->live_lock.is_locked() && h->state == State::kLive && mix == mix_of(h));
  const std::uint32_t thread = thread_number();
  mix ^= free_mix(h->free_thread, h->free_stack, h->state) ^ free_mix(thread, stack, state);
  h->free_thread = thread;
  h->free_stack = stack;
  unlink_live(d, h);
  h->state = state;
  h->checksum = mix_checksum(mix);
  BRISK_ASSERT(h->checksum == checksum_of(h));
}

// What a quarantined block counts against the quarantine's budget.
BRISK_ALWAYS_INLINE QuarantinedBlock quarantined(Header* h) { return {h, h->user_size + kHeaderBytes + kGuardBytes}; }

// Blocks up to this user size wait in their debug heap's batch (DebugHeap::freed) before the
// quarantine, filled under its lock: at most 16 x 1 KiB (plus headers) per heap outside the
// quarantine's budget, and a fill short enough to hold the lock for.
inline constexpr std::size_t kBatchedMax = 1024;

// Under d->live_lock, for h, a block of d just marked kQuarantined: fills it and adds it to d's
// batch when it is small (and the quarantine is on), returning true; else false, and h goes to
// the quarantine alone (quarantine_released). *out, *n: the batch, taken out of d, when it is
// full or h is not batched (so that h follows the blocks freed before it into the quarantine).
// Frees reported as misuse go to the quarantine without the batch: ahead of a batch's blocks,
// which then wait longer, never less.
BRISK_ALWAYS_INLINE bool batch_freed(DebugHeap* d, Header* h, QuarantinedBlock* out, std::size_t* n) {
  BRISK_ASSERT(d->live_lock.is_locked() && h->state == State::kQuarantined);
  bool batched = h->user_size <= kBatchedMax && g_quarantine.shard_budget() != 0;
  if (batched) {
    fill_user(h, kFreedByte);
    d->freed[d->freed_count++] = quarantined(h);
    if (d->freed_count < DebugHeap::kFreedBatch) return true;
  }
  *n = d->take_freed(out);
  return batched;
}

// The common case of a free and of a realloc, under d's lock: h live, its header, guard and
// canary intact; *mix its verified mix (mark_freed's input).
BRISK_ALWAYS_INLINE bool live_and_intact(const Header* h, std::uint64_t* mix) {
  if (h->state != State::kLive) return false;
  *mix = mix_of(h);
  return edges_intact(h, *mix);
}

// The end of a release: h into the quarantine behind its heap's batch, taken out in out[0, n)
// (unless h joined the batch).
BRISK_ALWAYS_INLINE bool quarantine_released(Header* h, bool batched, QuarantinedBlock* out, std::size_t n) {
  if (!batched) {
    fill_user(h, kFreedByte);
    out[n++] = quarantined(h);
  }
  if (n > 0) push_to_quarantine(out, n);
  return true;
}

}  // namespace brisk::debug
