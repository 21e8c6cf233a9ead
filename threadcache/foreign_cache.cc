// The foreign cache. See foreign_cache.h.
#include "threadcache/foreign_cache.h"

#include <atomic>

#include "core/chunk.h"
#include "core/size_class.h"

namespace brisk {

namespace {

Span* span_of_block(const Block* b) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  return chunk_of(a)->span_of(a);
}

// Empties h's cache (under its slow lock): each class's chain into lists[c], nullptr where empty.
// No block is read: the callers walk each chain once.
void take_all(Heap* h, Block* (&lists)[kNumClasses]) {
  for (unsigned c = 0; c < kNumClasses; ++c) {
    lists[c] = h->foreign[c];
    store_shared(h->foreign[c], static_cast<Block*>(nullptr));  // alloc_refill reads it without out_busy
  }
  store_shared(h->foreign_bytes, std::size_t{0});
}

}  // namespace

bool foreign_cache_add(Heap* h, Span* s, Block* b) {
  const unsigned c = s->size_class;
  if (!h->foreign_wanted[c]) return false;
  const std::size_t size = s->block_size;
  out_busy_begin(h);
  if (BRISK_UNLIKELY(foreign_cache_taken(h))) {
    out_busy_end(h);
    return false;
  }
  if (BRISK_UNLIKELY(h->foreign_bytes + size > h->foreign_limit)) {
    out_busy_end(h);
    // Full: this thread frees more of other threads' blocks than it allocates again. Everything
    // goes home, and no class is cached until this thread needs a new span of it again.
    for (bool& wanted : h->foreign_wanted) wanted = false;
    HeapSlowLock lock(h);
    foreign_cache_flush(h);
    return false;
  }
  foreign_cache_push(h, c, b, free_code(reinterpret_cast<std::uintptr_t>(b)).link_mask, size);
  out_busy_end(h);
  return true;
}

void foreign_cache_flush(Heap* h) {
  Block* lists[kNumClasses];
  take_all(h, lists);
  for (Block* b : lists) {
    while (b != nullptr) {
      Block* next = chain_next(b);
      Span* s = span_of_block(b);
      Heap* owner = s->owner.load(std::memory_order_acquire);
      if (owner == h) {  // h adopted the span (an orphan) since the block was cached
        auto a = reinterpret_cast<std::uintptr_t>(b);
        free_to_own_span(h, s, b, free_code(a));
      } else {
        outgoing_add(h, owner, b, s->block_size);
      }
      b = next;
    }
  }
}

std::size_t foreign_cache_send(Heap* h) {
  std::size_t sent = 0;
  Block* lists[kNumClasses];
  take_all(h, lists);
  for (Block* b : lists) {
    // Runs of blocks with one owner go as one chain (they are linked already).
    while (b != nullptr) {
      Span* s = span_of_block(b);
      Heap* owner = s->owner.load(std::memory_order_acquire);
      std::size_t bytes = s->block_size;
      Block* last = b;
      Block* next;
      for (; (next = chain_next(last)) != nullptr; last = next) {
        Span* t = span_of_block(next);
        if (t->owner.load(std::memory_order_acquire) != owner) break;
        bytes += t->block_size;
      }
      set_link(last, nullptr);
      send_chain(owner, b, last, bytes);
      sent += bytes;
      b = next;
    }
  }
  return sent;
}

}  // namespace brisk
