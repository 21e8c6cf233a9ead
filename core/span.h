// Span: a run of pages inside a chunk given to one size class (many blocks) or to one medium
// block. Its descriptor lives in the chunk header (chunk.h), never beside user data.
//
// Ownership: a span belongs to exactly one owner at a time, `owner`:
//   - a thread heap (threadcache/heap.h), which alone writes `free`, `used` and the carve
//     state, without atomics (but for the stores of its fast paths, see below); another thread
//     holding the heap's slow lock reads `used` and `free` of its installed spans to purge
//     them in place (threadcache/background.cc), and writes only the idle_* fields;
//   - or the orphan owner (a span of an exited thread, or surplus), held in the central pool of
//     its class; then only a holder of that class's central lock touches it.
// Other threads read only the immutable geometry (start, block_size, span_bytes, inverse,
// shift) and the atomic owner, to route a free to the right owner; and the statistics reader
// (threadcache/heap_stats.cc) reads kind, size_class, page_count, used, carved_blocks,
// idle_purged and idle_absorbed of any span, and block_size of a medium span (its usable size,
// which realloc changes in place).
// inverse and shift of a medium span are 1 and 0 whatever its size, written when it becomes
// medium, so realloc's in-place size changes leave them alone.
// Those are therefore written only as relaxed atomics (store_shared, and
// span_used_increment / span_used_decrement on the fast paths) and read across threads only
// with load_shared; their owner may read them plainly.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/assert.h"
#include "core/hints.h"

namespace brisk {

class Heap;

// A free block: word 0 links it into a free list or a remote queue, encoded; word 1 holds the
// free key while the block is free, so a second free of it is seen in one compare. Both are
// written and read only through core/free_key.h.
struct Block {
  std::uintptr_t link;
  std::uintptr_t key;
};

enum class SpanKind : std::uint8_t { kUnused = 0, kSmall = 1, kMedium = 2 };

// Two lines of its own: the descriptors of a chunk's spans lie side by side in its header
// (core/chunk.h), and a chunk's pages are claimed by several heaps (chunk_claim_shared: a new
// thread's first spans go into other heaps' chunks). At 88 bytes apart, one heap's free and used
// shared a line with the neighbouring span's hot fields, which another thread writes on each of
// its mallocs and frees: false sharing on both fast paths.
struct alignas(BRISK_CACHELINE) Span {
  // Line 0, read-mostly: what free_fast reads besides free and used, and all a remote free reads
  // (owner, geometry, kind). Written when the span is set up, by carving (once per OS page of
  // blocks) and by an in-place realloc of its medium block.
  char* start = nullptr;                  // first block
  std::atomic<Heap*> owner{nullptr};
  std::uint64_t inverse = 0;        // block_size = odd * 2^shift: odd's inverse modulo 2^64
  std::uint32_t block_size = 0;
  std::uint32_t span_bytes = 0;     // usable bytes: capacity * block_size, or the medium block's size
  std::uint32_t carved_blocks = 0;  // blocks from start already cut (lazy carving); a medium span: 1
  std::uint8_t shift = 0;
  std::uint8_t size_class = 0;
  SpanKind kind = SpanKind::kUnused;
  std::uint8_t first_page = 0;
  std::uint8_t page_count = 0;
  // A small span's 64 KiB pages (bit i: page i) that held data when it claimed them and were not
  // given back then: resident past its carved part, until carving reaches them (statistics; and
  // carving asks the kernel for the fresh OS pages it writes only where the bit is clear or the
  // chunk's os_pages record says so, carve.cc).
  std::uint8_t resident_pages = 0;
  // An emptied small span kept whole by its class's central pool for the class's next span
  // (threadcache/orphans.cc, keep_empty_span): on that pool's kept list; when it went there
  // (platform::now_ms, its low 32 bits); the bytes its blocks may have written, which the
  // pools' budget counts. Under the pool's lock. kept_ms of an orphan with live blocks: when it
  // last changed (orphaned, or a block came back to it), never 0, or 0 once brisk has made its
  // holes since (core/span_holes.h; the background pass makes them in orphans unchanged for a
  // purge delay, threadcache/orphans.h). Here, on the read-mostly line, since no thread
  // uses a kept span: the line's readers are remote freers, and a kept span has no live block.
  bool kept = false;
  // The owner's current span of its class, which it keeps installed when its last block comes
  // back (one page, or a retained class: free_local_adjust); set and cleared by the owner's
  // slow paths with `installed` and `retained` (threadcache/heap.h, set_current), read by its
  // free. A free that empties such a span returns at once: a thread that allocates and frees
  // one block at a time empties its span on every free, and the call to free_local_adjust
  // was a quarter of its malloc/free pair.
  bool stays_when_empty = false;
  std::uint32_t kept_ms = 0;
  std::uint32_t kept_bytes = 0;
  // OS pages of the carved part (bit i: the span's i-th, 64 at most) that brisk_trim or the
  // background pass gave back while the span kept a live block (core/span_holes.h): every
  // block touching one is free and
  // off the free list, and reads as zeros there. Nonzero only while no heap owns the span (an
  // orphan in its central pool), so that every free into it takes the orphan queue, which
  // reports a free of a block in a hole as a double free; the heap that takes it fills the holes
  // first (central_take). Under the pool's lock; the statistics reader reads it (load_shared).
  std::uint64_t hole_pages = 0;
  // Line 1, the owner's: written by its every malloc and free into the span (free, used) and by
  // its list operations. Apart from line 0, so that a thread freeing a block of the span remotely
  // reads a line the owner's fast paths do not keep taking back.
  alignas(BRISK_CACHELINE) Block* free = nullptr;  // owner's free list
  std::uint32_t used = 0;           // blocks handed out and not yet returned to this span
  bool listed = false;                  // on an owner's (or central) available list
  // The owner's own purge checks (Heap::purge_checks, its low 16 bits) done when the span last
  // became its class's spare (keep_spare): a spare still there and empty at the check after
  // the next goes back (heap_release_stale_kept_spans). In the padding after `listed`: this
  // line is full.
  std::uint16_t emptied_at_check = 0;
  Span* prev = nullptr;                   // available list links
  Span* next = nullptr;
  Span* all_prev = nullptr;               // the owning heap's list of every span it holds
  Span* all_next = nullptr;
  // An installed span whose pages went back while its heap was idle (threadcache/background.cc,
  // "purge in place"); written by the purging thread and read by the owner, both under the
  // heap's slow lock. idle_head: the free list's head then, whose pages were kept (the one block
  // a fast path already under way may still take); idle_absorbed: the blocks of the span that
  // were queued to the heap then and were dropped with the pages (still counted in used).
  Block* idle_head = nullptr;
  std::uint32_t idle_absorbed = 0;
  bool idle_purged = false;
  // A medium span: its first present_os_pages OS pages were in memory when the last calloc of
  // its block found them so or made them so (threadcache/medium.cc), and the next calloc from
  // the run within them does not ask the kernel again. brisk gives a live or cached run's pages
  // back only with the span (reset) or past a block shrunk in place (cut); a page that has
  // gone since all the same (swapped out, then decommitted by a larger calloc's zeroing, or
  // given back by the program itself) is faulted back in by that memset, zeroed still: only
  // the question is saved, never a zero. Written by the thread that holds the block, and reset
  // by release_span_pages (a freer of the block or the background thread, under the owner's
  // slow lock).
  std::uint16_t present_os_pages = 0;

  std::uint32_t carved_bytes() const { return carved_blocks * block_size; }
  // Whether address a, a block start of this span (checked already), lies in its carved part:
  // past it, the block was never handed out (slow paths; free_fast tests both at once).
  bool in_carved_part(std::uintptr_t a) const { return a - reinterpret_cast<std::uintptr_t>(start) < carved_bytes(); }
  bool fully_carved() const { return carved_bytes() + block_size > span_bytes; }
  bool has_room() const { return free != nullptr || !fully_carved() || hole_pages != 0; }
  // True if `offset` (an address minus start, wrapping below start) is the start of a carved
  // block: a multiple m * block_size with m < carved_blocks. One multiply and a rotate, the
  // divisibility test of Granlund and Montgomery ("Division by invariant integers using
  // multiplication", 1994, section 9): with block_size = odd * 2^shift and inverse * odd = 1
  // modulo 2^64, offset = m * block_size gives offset * inverse = m * 2^shift, which the rotate
  // turns back into m; any other offset either has one of its low `shift` bits set, which the
  // rotate moves to the top, or an odd part that odd does not divide, whose product with
  // inverse is, multiplication by an odd number being a bijection, none of the products of the
  // multiples: above 2^(64-shift) / odd, far above any block count. So "below the span", "past
  // the carved blocks" and "not at a block boundary" are one unsigned comparison, and the
  // dependent chain of a free is one multiply shorter than a reciprocal's index times size.
  // A medium span (one block) has inverse 1, shift 0 and carved_blocks 1: only offset 0 passes.
  bool is_carved_block(std::uintptr_t offset) const {
    return std::rotr(offset * inverse, shift) < carved_blocks;
  }
  // The same test against every block the span has room for, carved or not (slow paths:
  // free_slow's checked_block on every remote free). The quotient m, times block_size, is the
  // offset itself when offset is a block boundary, and overflows otherwise (m above 2^64 /
  // block_size, as above), so "m below the span's block count" is "m * block_size, without
  // overflow, below span_bytes" (span_bytes is a multiple of block_size), with no division (a
  // 32-bit div was 36% of checked_block's samples on xmalloc). A medium span: m is the offset,
  // m * block_size < span_bytes = block_size only for offset 0.
  bool is_block_start(std::uintptr_t offset) const {
    std::uint64_t end;
    return block_size != 0 &&
           !__builtin_mul_overflow(std::rotr(offset * inverse, shift), std::uint64_t{block_size}, &end) &&
           end < span_bytes;
  }
};

static_assert(sizeof(Span) == 2 * BRISK_CACHELINE && offsetof(Span, resident_pages) < BRISK_CACHELINE &&
                  offsetof(Span, free) == BRISK_CACHELINE,
              "a span's read-mostly fields and its owner's fill a cache line each (see Span)");

// inverse and shift of Span for a block size (a multiple of 16 for a size class; a medium span
// uses 1 and 0 whatever its size, see is_carved_block).
struct BlockDivisor {
  std::uint64_t inverse;
  std::uint8_t shift;
};
constexpr BlockDivisor block_divisor(std::uint64_t size) {
  std::uint8_t shift = 0;
  while ((size & 1) == 0) { size >>= 1; ++shift; }
  // Newton's iteration for the inverse modulo 2^64 of an odd number: x = size is right in its
  // low 3 bits, and each step doubles the bits that are right (3, 6, 12, 24, 48, 96).
  std::uint64_t x = size;
  for (int i = 0; i < 5; ++i) x *= 2 - size * x;
  return BlockDivisor{x, shift};
}

// A relaxed atomic store / load of a field that other threads read (see Ownership above).
template <class T>
BRISK_ALWAYS_INLINE void store_shared(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_relaxed);
}
template <class T>
BRISK_ALWAYS_INLINE T load_shared(const T& field) {
  return std::atomic_ref<T>(const_cast<T&>(field)).load(std::memory_order_relaxed);
}

// The fast paths' changes of `used`, by its one writer (the owner; for an orphan span the
// holder of its central pool's lock), as relaxed atomic stores. GCC 12 compiles a relaxed
// atomic_ref load + add + store to three instructions where the plain `s->used++` is one
// `addl $1, mem`: two more in malloc and in free. On x86-64 the one instruction is itself a
// relaxed atomic store for readers (an aligned 32-bit write is never torn, and a single writer
// needs no lock prefix), so it is written by hand there; a TSan build takes the atomic_ref form,
// which TSan can see and check.
// The decrement (a free) is a release store: the background thread reads `used` with acquire
// order before it gives away the pages of a span whose blocks are all free (threadcache/
// background.cc), and their next user must see the freeing thread's writes. On x86-64 every
// store is a release store for the hardware; the "memory" clobber keeps the compiler from
// moving the free's earlier stores below it.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
BRISK_ALWAYS_INLINE void span_used_increment(Span* s) { asm("addl $1, %0" : "+m"(s->used)); }
// Returns whether used reached 0.
BRISK_ALWAYS_INLINE bool span_used_decrement(Span* s) {
  bool zero;
  asm volatile("subl $1, %0" : "+m"(s->used), "=@ccz"(zero) : : "memory");
  return zero;
}
#else
BRISK_ALWAYS_INLINE void span_used_increment(Span* s) { store_shared(s->used, s->used + 1); }
BRISK_ALWAYS_INLINE bool span_used_decrement(Span* s) {
  std::uint32_t n = s->used - 1;
  std::atomic_ref<std::uint32_t>(s->used).store(n, std::memory_order_release);
  return n == 0;
}
#endif
// The same for k blocks at once, off the fast paths (a drain's run of blocks of one span).
BRISK_ALWAYS_INLINE bool span_used_subtract(Span* s, std::uint32_t k) {
  std::uint32_t n = s->used - k;
  std::atomic_ref<std::uint32_t>(s->used).store(n, std::memory_order_release);
  return n == 0;
}

// Intrusive doubly-linked list of spans through prev/next: push puts a span at the head, so the
// head is the span listed last and the tail the one listed first.
struct SpanList {
  Span* head = nullptr;
  Span* tail = nullptr;
  std::size_t count = 0;

  void push(Span* s) {
    BRISK_ASSERT(!s->listed && s->prev == nullptr && s->next == nullptr);
    s->prev = nullptr;
    s->next = head;
    if (head != nullptr) head->prev = s; else tail = s;
    head = s;
    s->listed = true;
    ++count;
  }
  void remove(Span* s) {
    BRISK_ASSERT(s->listed && count > 0 && (s->prev != nullptr || head == s) && (s->next != nullptr || tail == s));
    if (s->prev != nullptr) s->prev->next = s->next; else head = s->next;
    if (s->next != nullptr) s->next->prev = s->prev; else tail = s->prev;
    s->prev = s->next = nullptr;
    s->listed = false;
    --count;
  }
  Span* pop() {  // the span listed last
    Span* s = head;
    if (s != nullptr) remove(s);
    return s;
  }
  // Of the span listed last and the span listed first, the one with more room (a lower `used`;
  // the last on a tie), taken out; nullptr if empty. A list whose spans are added as they gain
  // room (a heap's) has at its head the one that gained it last, often a single block:
  // threadcache/heap.cc's refill has the measurements.
  Span* pop_roomier_end() {
    Span* last = head;
    if (last == nullptr) return nullptr;
    Span* s = tail->used < last->used ? tail : last;
    remove(s);
    return s;
  }
  // The head moves to the tail: a walk that must let go of the list's lock between spans takes
  // the head each time, and `count` moves put the list back in its order.
  void rotate() {
    Span* s = head;
    if (s == nullptr || s == tail) return;
    head = s->next;
    head->prev = nullptr;
    s->next = nullptr;
    s->prev = tail;
    tail->next = s;
    tail = s;
  }
};

}  // namespace brisk
