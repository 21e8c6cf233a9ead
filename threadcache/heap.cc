// Heap slow paths: refill, spans, remote frees, the orphan queue. The call map is in heap.h.
#include "threadcache/heap.h"

#include <atomic>
#include <cstring>

#include "core/central_pool.h"
#include "core/large.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/report.h"
#include "core/stats.h"

namespace brisk {

constinit Span g_empty_span{.block_size = 1};

namespace {

// Lazy carving: a span's blocks are cut (linked into its free list) one OS page at a time, up
// to the end of the page holding the next block, so a fresh span touches only the pages its
// blocks are handed out from. A page fault costs about 12 us on this project's VMs (measured
// with brisk-microbench's calloc_large), so carving a fixed 8 KiB, which touched a second page
// for a single block, showed up as extra faults in MMtest's strings test.
void carve(Span* s) {
  std::uint32_t bs = s->block_size;
  std::uint32_t remaining = (s->span_bytes - s->carved_bytes) / bs;
  char* first = s->start + s->carved_bytes;
  auto page_end = (reinterpret_cast<std::uintptr_t>(first) | (kOsPageSize - 1)) + 1;
  std::uint32_t n = static_cast<std::uint32_t>((page_end - reinterpret_cast<std::uintptr_t>(first)) / bs);
  if (n == 0) n = 1;
  if (n > remaining) n = remaining;
  char* p = first;
  for (std::uint32_t i = 0; i < n; ++i, p += bs) {
    auto* b = reinterpret_cast<Block*>(p);
    FreeCode code = free_code(reinterpret_cast<std::uintptr_t>(p));
    set_link(b, i + 1 < n ? reinterpret_cast<Block*>(p + bs) : s->free, code.link_mask);
    // A never-handed-out block carries the free key too: freeing it is caught as a double free.
    b->key = code.key;
  }
  s->free = reinterpret_cast<Block*>(first);
  s->carved_bytes += n * bs;
}

void all_link(Heap* h, Span* s) {
  s->all_prev = nullptr;
  s->all_next = h->all_spans;
  if (h->all_spans != nullptr) h->all_spans->all_prev = s;
  h->all_spans = s;
}

}  // namespace

void heap_unlink_span(Heap* h, Span* s) {
  if (s->all_prev != nullptr) s->all_prev->all_next = s->all_next; else h->all_spans = s->all_next;
  if (s->all_next != nullptr) s->all_next->all_prev = s->all_prev;
  s->all_prev = s->all_next = nullptr;
}

namespace {

// Pages for a new span, from the first of: resident free pages in this heap's chunks, then in
// other heaps' chunks; an abandoned chunk (adopted); any free pages in this heap's chunks, then
// in others'; a new chunk. Resident pages first everywhere: a page fault costs about 12 us here,
// and per-thread chunks alone left the realloc-chain workload with 140 MB resident against
// tcmalloc's 83 MB, 50 MB of it free pages that only their own heap would reuse.
Chunk* claim_pages_for_span(Heap* h, unsigned pages, unsigned* first_out, bool* zeroed) {
  Chunk* ch = nullptr;
  unsigned first = 0;
  auto claim_own = [&](bool resident_only) {
    for (Chunk* c = h->chunks; c != nullptr; c = c->next) {
      if (c->free_pages.load(std::memory_order_relaxed) == 0) continue;
      if (resident_only && !chunk_has_resident_run(c, pages)) continue;
      first = chunk_claim_pages(c, pages, zeroed);
      if (first != 0) return c;
    }
    return static_cast<Chunk*>(nullptr);
  };
  ch = claim_own(true);
  if (ch == nullptr) ch = chunk_claim_shared(h, pages, true, &first, zeroed);
  if (ch == nullptr) {
    Chunk* c = chunk_adopt(h);
    if (c != nullptr) {
      chunk_list_push(h->chunks, c);
      first = chunk_claim_pages(c, pages, zeroed);
      if (first != 0) ch = c;
    }
  }
  if (ch == nullptr) ch = claim_own(false);
  if (ch == nullptr) ch = chunk_claim_shared(h, pages, false, &first, zeroed);
  if (ch == nullptr) {
    Chunk* c = chunk_create(h);
    if (c == nullptr) return nullptr;
    chunk_list_push(h->chunks, c);
    // The new chunk is visible to other heaps already; in the rare case they took its pages,
    // the caller tries again.
    first = chunk_claim_pages(c, pages, zeroed);
    if (first != 0) ch = c;
  }
  *first_out = first;
  return ch;
}

Span* span_create(Heap* h, unsigned pages, bool* zeroed = nullptr) {
  unsigned first = 0;
  Chunk* ch = nullptr;
  for (int attempt = 0; attempt < 4 && ch == nullptr; ++attempt) ch = claim_pages_for_span(h, pages, &first, zeroed);
  if (ch == nullptr) return nullptr;
  Span* s = &ch->spans[first];
  s->first_page = static_cast<std::uint8_t>(first);
  s->page_count = static_cast<std::uint8_t>(pages);
  s->start = ch->page_address(first);
  s->free = nullptr;
  s->listed = false;
  s->prev = s->next = nullptr;
  for (unsigned i = first; i < first + pages; ++i) ch->page_span[i] = s;
  return s;
}

Span* span_new_small(Heap* h, unsigned c) {
  const SizeClassInfo& info = kClasses[c];
  Span* s = span_create(h, info.span_pages);
  if (s == nullptr) return nullptr;
  s->used = 0;
  s->carved_bytes = 0;
  s->block_size = info.size;
  s->span_bytes = info.capacity * info.size;
  s->reciprocal = info.reciprocal;
  s->size_class = static_cast<std::uint8_t>(c);
  s->kind = SpanKind::kSmall;
  s->owner.store(h, std::memory_order_release);
  all_link(h, s);
  return s;
}

void set_medium_geometry(Span* s, unsigned pages) {
  std::uint32_t bytes = static_cast<std::uint32_t>(pages) << kPageShift;
  s->page_count = static_cast<std::uint8_t>(pages);
  s->block_size = bytes;
  s->span_bytes = bytes;
  s->carved_bytes = bytes;
  s->reciprocal = ((std::uint64_t{1} << kReciprocalShift) + bytes - 1) / bytes;
}

// Resets a span's descriptor and gives its pages back to the chunk.
void release_span_pages(Span* s) {
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  unsigned first = s->first_page, count = s->page_count;
  s->kind = SpanKind::kUnused;
  s->free = nullptr;
  s->used = 0;
  s->carved_bytes = 0;
  s->span_bytes = 0;
  s->owner.store(nullptr, std::memory_order_relaxed);
  if (chunk_release_pages(ch, first, count)) chunk_release_if_abandoned_and_empty(ch);
}

// Returns to the OS the resident memory of free pages that stayed unused for at least
// BRISK_PURGE_DELAY_MS: at each check (every BRISK_PURGE_BYTES of span releases, so an idle
// thread costs nothing) it purges the pages that were free and dirty at the previous check and
// still are, if that check is old enough. A page freed and claimed again in between is spared,
// so the pages a steady workload keeps reusing stay resident. This is jemalloc's decay, with
// the clock read only at checks: no background thread. Whole empty chunks beyond one spare go
// to the chunk cache. keep == 0 (brisk_thread_collect) purges everything at once.
// Measured on the producer/consumer workload: purging every free dirty page past a byte
// threshold cost 1985 madvise calls and a third of the run in refaults; aging by bytes alone
// (no clock) still left madvise at 21% of the profile.
void heap_purge(Heap* h, std::size_t keep) {
  h->released_since_purge = 0;
  std::uint64_t now = platform::now_ms();
  auto delay = static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  bool age = keep == 0 || now - h->aged_at_ms >= delay;
  if (!age) return;
  h->aged_at_ms = now;
  bool kept_spare = false;
  for (Chunk* c = h->chunks; c != nullptr;) {
    Chunk* next = c->next;
    std::uint64_t free = c->free_pages.load(std::memory_order_acquire);
    std::uint64_t free_dirty = free & c->dirty_pages.load(std::memory_order_relaxed);
    if (free == kAllPagesFree && kept_spare) {
      chunk_list_remove(h->chunks, c);
      if (!chunk_destroy(c)) chunk_list_push(h->chunks, c);  // another heap took pages in it just now
    } else {
      kept_spare |= free == kAllPagesFree;
      std::uint64_t stale = keep == 0 ? free_dirty : free_dirty & c->aged;
      if (stale != 0) chunk_purge(c, stale);
      c->aged = free_dirty & ~stale;
    }
    c = next;
  }
}

void send_chain(Heap* dest, Block* first, Block* last) {
  if (!dest->incoming.push(first, last)) {
    // The owner has exited (its queue is closed): its spans are, or are about to be, orphans.
    g_orphan_heap.incoming.push(first, last);
  }
}

void flush_batch(OutgoingBatch& o) {
  if (o.count != 0) send_chain(o.dest, o.head, o.tail);
  o.head = o.tail = nullptr;
  o.count = 0;
  o.bytes = 0;
}

void outgoing_add(Heap* h, Heap* dest, Block* b, std::size_t size) {
  OutgoingBatch& o = h->outgoing[dest->id & (kRemoteSlots - 1)];
  if (o.dest != dest) {
    flush_batch(o);
    o.dest = dest;
  }
  set_link(b, o.head);
  o.head = b;
  if (o.tail == nullptr) o.tail = b;
  o.bytes += size;
  if (++o.count >= kRemoteBatch || o.bytes >= kRemoteBatchBytes) flush_batch(o);
}

// A block that arrived in h's queue. The span may have changed owner since it was sent.
void process_owned_block(Heap* h, Block* b) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  Span* s = chunk_of(a)->span_of(a);
  Heap* owner = s->owner.load(std::memory_order_acquire);
  if (owner != h) {
    if (owner == nullptr) fatal_pointer_error("invalid free of", b, "its span is not in use");
    send_chain(owner, b, b);
    return;
  }
  if (a - reinterpret_cast<std::uintptr_t>(s->start) >= s->carved_bytes)
    fatal_pointer_error("invalid free of", b, "never handed out");
  free_to_own_span(h, s, b, free_code(a));
}

// A thread freeing into a span whose owner exited takes the span over (one lock round-trip)
// instead of sending each block through the orphan queue (one lock round-trip per block): the
// Larson pattern, where a thread inherits its predecessor's blocks, then frees locally.
bool adopt_orphan_span(Heap* h, Span* s) {
  CentralPool& pool = g_central[central_index(s)];
  {
    LockGuard g(pool.lock);
    if (s->owner.load(std::memory_order_relaxed) != &g_orphan_heap) return false;
    if (s->listed) pool.remove(s);
    s->owner.store(h, std::memory_order_release);
    stats::add(stats::g.spans_orphaned, -1);
  }
  all_link(h, s);
  if (s->kind == SpanKind::kSmall && s->has_room()) h->available[s->size_class].push(s);
  return true;
}

void process_orphan_block(Block* b) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  Span* s = chunk_of(a)->span_of(a);
  CentralPool& pool = g_central[central_index(s)];
  pool.lock.lock();
  Heap* owner = s->owner.load(std::memory_order_acquire);
  if (owner != &g_orphan_heap) {
    pool.lock.unlock();
    if (owner == nullptr) fatal_pointer_error("invalid free of", b, "its span is not in use");
    send_chain(owner, b, b);
    return;
  }
  if (a - reinterpret_cast<std::uintptr_t>(s->start) >= s->carved_bytes) {
    pool.lock.unlock();
    fatal_pointer_error("invalid free of", b, "never handed out");
  }
  Block* old = s->free;
  set_link(b, old);
  s->free = b;
  if (--s->used == 0) {
    if (s->listed) pool.remove(s);
    stats::add(stats::g.spans_orphaned, -1);
    pool.lock.unlock();
    release_span_pages(s);
    return;
  }
  if (old == nullptr && s->kind == SpanKind::kSmall && !s->listed) pool.push(s);
  pool.lock.unlock();
}

}  // namespace

void heap_release_span(Heap* h, Span* s) {
  if (s->listed) h->available[s->size_class].remove(s);
  heap_unlink_span(h, s);
  std::size_t bytes = std::size_t{s->page_count} << kPageShift;
  release_span_pages(s);
  h->released_since_purge += bytes;
  std::size_t keep = static_cast<std::size_t>(options::get(options::Id::kPurgeBytes));
  if (h->released_since_purge >= keep) heap_purge(h, keep);
}

// Keeps an emptied multi-page current span of class c. Past kRetainedLargeSpans classes, the
// class kept longest ago gives its current span back if that is still empty. A class already
// kept is not added again: recording every emptying (a first version did) made alloc/free
// ping-pong over three classes release and recreate a span on each free.
void retain_empty_span(Heap* h, unsigned c) {
  if (h->retained[c]) return;
  unsigned slot = h->retained_next;
  h->retained_next = static_cast<std::uint8_t>((slot + 1) % kRetainedLargeSpans);
  if (h->retained_count == kRetainedLargeSpans) {
    unsigned old = h->retained_classes[slot];
    h->retained[old] = false;
    Span* s = h->current[old];
    if (s != &g_empty_span && s->used == 0) {
      h->current[old] = &g_empty_span;
      heap_release_span(h, s);
    }
  } else {
    ++h->retained_count;
  }
  h->retained_classes[slot] = static_cast<std::uint8_t>(c);
  h->retained[c] = true;
}

void free_local_adjust(Heap* h, Span* s) {
  if (s->used == 0) {
    // Keep the class's current span even when empty: alloc/free ping-pong stays on the fast path.
    if (s->kind == SpanKind::kSmall && h->current[s->size_class] == s) {
      if (s->page_count > 1) retain_empty_span(h, s->size_class);
      return;
    }
    heap_release_span(h, s);
    return;
  }
  // The span was full and has a free block again.
  if (s->kind == SpanKind::kSmall && !s->listed && h->current[s->size_class] != s)
    h->available[s->size_class].push(s);
}

void heap_flush_outgoing(Heap* h) {
  for (auto& o : h->outgoing) flush_batch(o);
}

void heap_drain_incoming(Heap* h) { heap_process_blocks(h, h->incoming.take_all()); }

namespace {

// The next block of a chain of remote frees. A chain crosses spans and chunks, so a sound link
// is null or a 16-byte aligned address in a brisk chunk; anything else was written after the
// free.
Block* chain_next(const Block* b) {
  std::uintptr_t next = decoded_link(b);
  if (kEncodeFreeLinks && next != 0 && ((next & (kMinAlign - 1)) != 0 || region_kind(next) != kRegionChunk))
    free_list_damaged(b);
  return reinterpret_cast<Block*>(next);
}

}  // namespace

void free_list_damaged(const Block* b) {
  fatal_pointer_error("damaged free list: the link in freed block", b,
                      "was written after the free (a use after free, or an overflow of the block before it)");
}

void heap_process_blocks(Heap* h, Block* b) {
  while (b != nullptr) {
    Block* next = chain_next(b);
    process_owned_block(h, b);
    b = next;
  }
}

void drain_orphans() {
  Block* b = g_orphan_heap.incoming.take_all();
  while (b != nullptr) {
    Block* next = chain_next(b);
    process_orphan_block(b);
    b = next;
  }
}

BRISK_NOINLINE void* alloc_refill(Heap* h, unsigned c) {
  if (BRISK_UNLIKELY(!heap_is_attached(h))) {
    void* p;
    if (h == &g_exited_heap) {
      p = alloc_with_borrowed_heap([c](Heap* borrowed) { return alloc_refill(borrowed, c); });
    } else {
      h = heap_for_this_thread();
      p = h != nullptr ? alloc_small(h, c) : nullptr;
    }
    if (p == nullptr) errno = ENOMEM;
    return p;
  }
  if (!h->incoming.empty()) heap_drain_incoming(h);
  if (!g_orphan_heap.incoming.empty()) drain_orphans();
  Span* s = h->current[c];
  if (s->free == nullptr) {
    if (s != &g_empty_span && !s->fully_carved()) {
      carve(s);
    } else {
      // The current span is full: it stays owned and unlisted until a block comes back to it.
      s = h->available[c].pop();
      if (s == nullptr) {
        s = central_take(c, h);
        if (s != nullptr) all_link(h, s);
      }
      if (s == nullptr) s = span_new_small(h, c);
      if (s == nullptr) {
        errno = ENOMEM;
        return nullptr;
      }
      h->current[c] = s;
      if (s->free == nullptr) carve(s);
    }
  }
  return alloc_small(h, c);  // the current span has a free block now
}

void* alloc_medium(Heap* h, std::size_t size, bool zero) {
  unsigned pages = static_cast<unsigned>((size + kPageSize - 1) >> kPageShift);
  if (!h->incoming.empty()) heap_drain_incoming(h);
  bool zeroed = false;
  Span* s = span_create(h, pages, &zeroed);
  if (s == nullptr) return nullptr;
  set_medium_geometry(s, pages);
  s->used = 1;
  s->size_class = 0;
  s->kind = SpanKind::kMedium;
  s->owner.store(h, std::memory_order_release);
  all_link(h, s);
  auto* b = reinterpret_cast<Block*>(s->start);
  if (zero && !zeroed) {
    std::memset(b, 0, size);
  } else {
    b->key = 0;
  }
  return b;
}

bool medium_resize_in_place(Span* s, std::size_t new_size) {
  unsigned pages = s->page_count;
  unsigned want = static_cast<unsigned>((new_size + kPageSize - 1) >> kPageShift);
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  if (want == pages) return true;
  if (want < pages) {
    set_medium_geometry(s, want);
    chunk_release_pages(ch, s->first_page + want, pages - want);
    return true;
  }
  // Any thread may grow a live block it holds: the geometry is read by others only once the
  // block is freed, and the page claim is a compare-and-swap.
  if (!chunk_claim_pages_at(ch, s->first_page + pages, want - pages)) return false;
  for (unsigned i = s->first_page + pages; i < s->first_page + want; ++i) ch->page_span[i] = s;
  set_medium_geometry(s, want);
  return true;
}

BlockRef checked_block(const void* p, const char* what) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t kind = region_kind(a);
  if (kind == kRegionChunk) {
    Span* s = chunk_of(a)->span_of(a);
    if (s->kind == SpanKind::kUnused) fatal_pointer_error(what, p, "not a block brisk handed out");
    std::uintptr_t offset = a - reinterpret_cast<std::uintptr_t>(s->start);
    if (offset >= s->span_bytes || !s->is_block_start(offset))
      fatal_pointer_error(what, p, "points inside a block, not at its start");
    return BlockRef{s, nullptr};
  }
  if (region_is_large(kind)) {
    if (LargeHeader* lh = large_header_of(p, kind)) return BlockRef{nullptr, lh};
    fatal_pointer_error(what, p, "not the start of a block brisk handed out");
  }
  fatal_pointer_error(what, p, "not a block brisk handed out");
}

BRISK_NOINLINE void free_slow(void* p) {
  if (p == nullptr) return;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  BlockRef ref = checked_block(p, "invalid free of");
  if (ref.large != nullptr) {
    large_free(p, ref.large);
    return;
  }
  Span* s = ref.span;
  auto* b = static_cast<Block*>(p);
  FreeCode code = free_code(a);
  Heap* owner = s->owner.load(std::memory_order_acquire);
  Heap* h = t_heap;
  if (owner == h) {
    // The fast path refused it: it is free already, or lies beyond the carved blocks.
    if (b->key == code.key) fatal_pointer_error("double free of", p, nullptr);
    fatal_pointer_error("invalid free of", p, "never handed out");
  }
  // A remote free claims the block by setting its key in one atomic exchange: of two threads
  // freeing it at once, exactly one reads a value other than the key, so the block joins one
  // outgoing batch only. (The owner's free_fast checks and sets the key without an atomic; a
  // free by the owner racing with a remote free of the same block is not caught.)
  if (std::atomic_ref<std::uintptr_t>(b->key).exchange(code.key, std::memory_order_relaxed) == code.key)
    fatal_pointer_error("double free of", p, nullptr);
  if (h == &g_exited_heap) {
    h = nullptr;  // the thread must not own a heap again
  } else if (h == &g_sentinel_heap) {
    h = heap_for_this_thread();
  }
  if (h == nullptr) {
    send_chain(owner, b, b);  // no heap (exited thread, or out of memory for one): send it alone
    return;
  }
  if (owner == &g_orphan_heap && adopt_orphan_span(h, s)) {
    // The span is ours now: this free, and the next ones into it, are local.
    free_to_own_span(h, s, b, code);
    return;
  }
  outgoing_add(h, owner, b, s->block_size);
}

void heap_collect(Heap* h) {
  heap_flush_outgoing(h);
  heap_drain_incoming(h);
  drain_orphans();
  for (unsigned c = 0; c < kNumClasses; ++c) {
    Span* s = h->current[c];
    if (s != &g_empty_span && s->used == 0) {
      h->current[c] = &g_empty_span;
      heap_release_span(h, s);
    }
  }
  heap_purge(h, 0);
  large_cache_flush();
}

}  // namespace brisk
