// Medium blocks. See medium.h.
#include "threadcache/medium.h"

#include <cstring>

#include "core/assert.h"
#include "core/chunk.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {
namespace {

unsigned pages_for(std::size_t size) { return static_cast<unsigned>((size + kPageSize - 1) >> kPageShift); }

// A medium block's usable size is its request rounded up to kMinAlign, not its pages: realloc
// copies the old usable size when the block must move, and a 70 KiB block in two 64 KiB pages
// would copy 128 KiB (MMtest medium: every block from 70 KiB up moves once). The pages' tail
// stays part of the span; a realloc within the pages only changes this size.
void set_medium_geometry(Span* s, unsigned pages, std::size_t size) {
  auto bytes = static_cast<std::uint32_t>((size + kMinAlign - 1) & ~(kMinAlign - 1));
  BRISK_ASSERT(pages_for(bytes) == pages);
  store_shared(s->page_count, static_cast<std::uint8_t>(pages));
  store_shared(s->block_size, bytes);
  s->span_bytes = bytes;
  store_shared(s->carved_bytes, bytes);
  s->reciprocal = ((std::uint64_t{1} << kReciprocalShift) + bytes - 1) / bytes;
}

}  // namespace

void* alloc_medium(Heap* h, std::size_t size, bool zero) {
  unsigned pages = pages_for(size);
  std::uint64_t dirty = ~std::uint64_t{0};
  Span* s;
  {
    // Not held over the memset below: its page faults would keep the lock for hundreds of
    // microseconds, and remote frees of this heap's medium blocks only try the lock
    // (free_remote_medium).
    HeapSlowLock lock(h);
    if (!h->incoming.empty()) heap_drain_incoming(h);
    s = span_create(h, pages, &dirty);
    if (s == nullptr) return nullptr;
    set_medium_geometry(s, pages, size);
    store_shared(s->used, 1u);
    store_shared(s->size_class, std::uint8_t{0});
    store_shared(s->kind, SpanKind::kMedium);
    s->owner.store(h, std::memory_order_release);
    heap_link_span(h, s);
  }
  auto* b = reinterpret_cast<Block*>(s->start);
  if (zero && dirty != 0) {
    std::memset(b, 0, size);
  } else {
    b->key = 0;
  }
  return b;
}

bool medium_resize_in_place(Span* s, std::size_t new_size) {
  BRISK_ASSERT(s->kind == SpanKind::kMedium && s->used == 1);
  unsigned pages = s->page_count;
  unsigned want = pages_for(new_size);
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  if (want == pages) {
    set_medium_geometry(s, pages, new_size);
    return true;
  }
  if (want < pages) {
    set_medium_geometry(s, want, new_size);
    chunk_release_pages(ch, s->first_page + want, pages - want);
    return true;
  }
  // Any thread may grow a live block it holds: the geometry is read by others only once the
  // block is freed, and the page claim is a compare-and-swap.
  if (!chunk_claim_pages_at(ch, s->first_page + pages, want - pages)) return false;
  for (unsigned i = s->first_page + pages; i < s->first_page + want; ++i) ch->page_span[i] = s;
  set_medium_geometry(s, want, new_size);
  return true;
}

}  // namespace brisk
