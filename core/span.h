// Span: a run of pages inside a chunk given to one size class (many blocks) or to one medium
// block. Its descriptor lives in the chunk header (chunk.h), never beside user data.
//
// Ownership: a span belongs to exactly one owner at a time, `owner`:
//   - a thread heap (threadcache/heap.h), which alone touches `free`, `used` and the carve
//     state, without atomics;
//   - or the orphan owner (a span of an exited thread, or surplus), held in the central pool of
//     its class; then only a holder of that class's central lock touches it.
// Other threads read only the immutable geometry (start, block_size, span_bytes, reciprocal)
// and the atomic owner, to route a free to the right owner; and the statistics reader
// (threadcache/heap_stats.cc) reads kind, size_class, page_count, used and carved_bytes of any
// span, and block_size of a medium span (its usable size, which realloc changes in place).
// Those are therefore written only as relaxed atomics (store_shared, and
// span_used_increment / span_used_decrement on the fast paths) and read across threads only
// with load_shared; their owner may read them plainly.
#pragma once

#include <atomic>
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

struct Span {
  // Hot: read on every allocation and local free.
  Block* free = nullptr;                  // owner's free list
  std::uint32_t used = 0;           // blocks handed out and not yet returned to this span
  std::uint32_t carved_bytes = 0;   // bytes from start already cut into blocks (lazy carving)
  char* start = nullptr;                  // first block
  std::atomic<Heap*> owner{nullptr};
  std::uint64_t reciprocal = 0;     // ceil(2^40 / block_size)
  std::uint32_t block_size = 0;
  std::uint32_t span_bytes = 0;     // usable bytes: capacity * block_size, or the medium block's size
  // Cold.
  std::uint8_t size_class = 0;
  SpanKind kind = SpanKind::kUnused;
  std::uint8_t first_page = 0;
  std::uint8_t page_count = 0;
  bool listed = false;                  // on an owner's (or central) available list
  // A small span's 64 KiB pages (bit i: page i) that held data when it claimed them and were not
  // given back then: resident past its carved part, until carving reaches them (statistics).
  std::uint8_t resident_pages = 0;
  Span* prev = nullptr;                   // available list links
  Span* next = nullptr;
  Span* all_prev = nullptr;               // the owning heap's list of every span it holds
  Span* all_next = nullptr;

  bool fully_carved() const { return carved_bytes + block_size > span_bytes; }
  bool has_room() const { return free != nullptr || !fully_carved(); }
  // True if p is the start of a block of this span (p inside [start, start + span_bytes)).
  bool is_block_start(std::uintptr_t offset) const {
    std::uint64_t index = (offset * reciprocal) >> 40;
    return index * block_size == offset;
  }
};

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

// Intrusive doubly-linked list of spans through prev/next.
struct SpanList {
  Span* head = nullptr;
  std::size_t count = 0;

  void push(Span* s) {
    BRISK_ASSERT(!s->listed && s->prev == nullptr && s->next == nullptr);
    s->prev = nullptr;
    s->next = head;
    if (head != nullptr) head->prev = s;
    head = s;
    s->listed = true;
    ++count;
  }
  void remove(Span* s) {
    BRISK_ASSERT(s->listed && count > 0 && (s->prev != nullptr || head == s));
    if (s->prev != nullptr) s->prev->next = s->next; else head = s->next;
    if (s->next != nullptr) s->next->prev = s->prev;
    s->prev = s->next = nullptr;
    s->listed = false;
    --count;
  }
  Span* pop() {
    Span* s = head;
    if (s != nullptr) remove(s);
    return s;
  }
};

}  // namespace brisk
