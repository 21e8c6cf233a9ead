// Medium blocks. See medium.h.
#include "threadcache/medium.h"

#include <cstring>

#include "core/assert.h"
#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {
namespace {

unsigned pages_for(std::size_t size) { return static_cast<unsigned>((size + kPageSize - 1) >> kPageShift); }

// A medium block's usable size is its request rounded up to kMinAlign, not its pages: realloc
// copies the old usable size when the block must move, and a 70 KiB block in two 64 KiB pages
// would copy 128 KiB (MMtest medium: every block from 70 KiB up moves once). The pages' tail
// stays part of the span; a realloc within the pages only changes this size. A span taken from
// the cache may have more pages than the size needs (medium_cache_pick).
void set_medium_geometry(Span* s, unsigned pages, std::size_t size) {
  auto bytes = static_cast<std::uint32_t>((size + kMinAlign - 1) & ~(kMinAlign - 1));
  BRISK_ASSERT(pages_for(bytes) <= pages);
  store_shared(s->page_count, static_cast<std::uint8_t>(pages));
  store_shared(s->block_size, bytes);
  s->span_bytes = bytes;
}

// The medium cache: a freed medium block's span stays with its heap, still owned, linked and of
// kind kMedium, with `used` 0 and the free key in its block (a second free of the block is then
// reported as a double free, by the owner's free_fast or by a remote free's exchange), until
// the heap's next medium block takes it, or it is evicted, flushed or the heap detaches. Only
// under the heap's slow lock. It is the thread cache idea (tcmalloc, mimalloc) applied to page
// runs: without it every medium malloc and free claims and releases pages in the chunk's page
// sets (two compare-and-swaps, the descriptor's set-up and the purge accounting).

std::size_t run_bytes(const Span* s) { return std::size_t{s->page_count} << kPageShift; }

Span* medium_cache_remove(Heap* h, unsigned i) {
  Span* s = h->medium_cache[i];
  unsigned n = h->medium_cache_count;
  for (unsigned j = i + 1; j < n; ++j) h->medium_cache[j - 1] = h->medium_cache[j];
  h->medium_cache[n - 1] = nullptr;
  h->medium_cache_count = static_cast<std::uint8_t>(n - 1);
  h->medium_cache_bytes -= run_bytes(s);
  return s;
}

// The cached span for a block of `pages` pages: of those with `pages` to 1.5 x `pages` pages,
// the one with the most (newest first among equals), so that a block that grows by realloc
// finds its pages already there (MMtest medium doubles every block); -1 if none fits. More
// than half again would hold pages a live block does not use for as long as it lives.
int medium_cache_pick(const Heap* h, unsigned pages) {
  unsigned most = pages + pages / 2;
  int best = -1;
  unsigned best_pages = 0;
  for (int i = h->medium_cache_count - 1; i >= 0; --i) {
    unsigned n = h->medium_cache[i]->page_count;
    if (n >= pages && n <= most && n > best_pages) {
      best = i;
      best_pages = n;
    }
  }
  return best;
}

// Debug heaps keep runs too: a debug block's run comes back when the block leaves the
// quarantine, and the thread's next medium debug block takes it like a release one. Without
// them every medium debug malloc and free claimed and released chunk pages (debug mode without
// stacks, 7 pairs: MMtest medium 2.18x release brisk's time, 1.92x with the cache; medium-raw
// 2.91x, 2.48x; README "Debug mode").
std::size_t medium_cache_budget() { return static_cast<std::size_t>(options::get(options::Id::kMediumCacheBytes)); }

// Releases the oldest cached spans until the cache holds at most `bytes` and `slots` spans.
void medium_cache_shrink(Heap* h, std::size_t bytes, unsigned slots) {
  while (h->medium_cache_count != 0 && (h->medium_cache_bytes > bytes || h->medium_cache_count > slots))
    heap_release_span(h, medium_cache_remove(h, 0));
}

// calloc's zeroing of a medium block: only its 64 KiB pages that the claim found dirty (bit i:
// page i of the run may hold old data, chunk.h's "Page state"; all of them for a run from the
// medium cache), and, when they add up to kAskMin or more, of those only the OS pages present in
// memory (platform::zero_pages: memset where present, nothing where never touched since the
// pages were mapped or decommitted). A memset of the whole block faulted every untouched OS page
// in for nothing where the block before had written a few: on the producer/consumer workload,
// whose blocks are written at their edges and one word every 64 KiB, that memset took half of
// all page faults. Asking costs a mincore (about 0.7 us for 50 pages here) and, where pages are
// absent, a read of /proc/self/pagemap (1.6 us with its checks), which a block written whole
// pays for nothing and a small one can save little with: asking at every size (with pagemap
// alone) made a loop of callocs of 70-98 KB, each written whole, take 1.16x the time.
constexpr std::size_t kAskMin = 128 * 1024;
//
// A run whose block's OS pages the last calloc from it found all present, or wrote whole, has
// them present still (Span::present_os_pages): a calloc it serves again writes zeros over them
// without asking (a loop of fixed-size callocs written whole from one cached run asked once
// per calloc for the same answer: about 5% behind glibc and tcmalloc, `brisk-calloc-loop
// 200000 20000 fixed`). A sparse block's run, whose untouched pages the question found absent,
// learns nothing, and is asked again the next time.
void zero_dirty_pages(Span* s, std::size_t size, std::uint64_t dirty) {
  char* start = s->start;
  const std::size_t os_pages = (size + kOsPageSize - 1) / kOsPageSize;
  if (os_pages <= s->present_os_pages) {
    std::memset(start, 0, size);
    return;
  }
  const unsigned pages = pages_for(size);
  BRISK_ASSERT(pages < 64);
  const std::uint64_t in_block = dirty & run_mask(0, pages);
  // The block's bytes in its dirty pages: whole pages, less the part of the last one past its end.
  std::size_t dirty_bytes = std::size_t{count_bits(in_block)} << kPageShift;
  if (((in_block >> (pages - 1)) & 1) != 0) dirty_bytes -= (std::size_t{pages} << kPageShift) - size;
  const bool ask = dirty_bytes >= kAskMin;
  bool all_present = true;
  for_each_bit_run(in_block, [&](unsigned first, unsigned n) {
    const std::size_t from = std::size_t{first} << kPageShift;
    const std::size_t to = std::size_t{first + n} << kPageShift;
    const std::size_t bytes = (to < size ? to : size) - from;
    // Whole OS pages for zero_pages: the run's pages extend past the block, and are its span's.
    if (ask) all_present = platform::zero_pages(start + from, (bytes + kOsPageSize - 1) & ~(kOsPageSize - 1)) && all_present;
    else std::memset(start + from, 0, bytes);
  });
  // Every OS page of the block is present now if every one of its 64 KiB pages was zeroed
  // (dirty) and none of their OS pages was left absent.
  if (all_present && in_block == run_mask(0, pages)) s->present_os_pages = static_cast<std::uint16_t>(os_pages);
}

}  // namespace

void* alloc_medium(Heap* h, std::size_t size, bool zero, std::size_t room) {
  BRISK_ASSERT(room == 0 || room >= size);
  unsigned pages = pages_for(room > size ? room : size);
  std::uint64_t dirty = ~std::uint64_t{0};
  Span* s;
  {
    // Not held over calloc's zeroing below: its page faults would keep the lock for hundreds of
    // microseconds, and remote frees of this heap's medium blocks only try the lock
    // (free_remote_medium).
    HeapSlowLock lock(h);
    if (!h->incoming.empty()) heap_drain_incoming(h);
    int i = medium_cache_pick(h, pages);
    if (i >= 0) {
      // Owned and linked already; its pages held a block (dirty).
      s = medium_cache_remove(h, static_cast<unsigned>(i));
      set_medium_geometry(s, s->page_count, size);
      // The free that cached it pushed its block on the span's free list; a reclaim of frees
      // queued to h (background.cc) leaves a span alone while its free list looks non-empty.
      s->free = nullptr;
      store_shared(s->used, 1u);
    } else {
      // A miss gives back the oldest cached run, before the claim that may take its pages: runs
      // of sizes the thread no longer asks for (a string growing by a page at a time leaves one
      // per size) do not stay for good. So does every run smaller than this request: a thread
      // whose blocks grow leaves them behind at each step, and in debug mode, where the runs
      // come back from the quarantine several blocks late, a growing string kept 5-7 of them
      // (up to 1.5 MiB a thread; MMtest strings at 2.8x release brisk's time and 41 MiB, against
      // 2.2x and 26 MiB without a cache). A thread of random sizes loses some runs it could have
      // used: release mode's medium and medium-raw rows stayed level (0.97 and 1.06, intervals
      // containing 1). A switch to a smaller budget reaches the cache here too, and at the next
      // free.
      if (h->medium_cache_count != 0) {
        heap_release_span(h, medium_cache_remove(h, 0));
        for (unsigned j = h->medium_cache_count; j-- > 0;)
          if (h->medium_cache[j]->page_count < pages) heap_release_span(h, medium_cache_remove(h, j));
        medium_cache_shrink(h, medium_cache_budget(), kMediumCacheSlots);
      }
      s = span_create(h, pages, &dirty);
      if (s == nullptr) return nullptr;
      set_medium_geometry(s, pages, size);
      // One block at offset 0 whatever its size, which realloc changes in place (written here
      // only, not by set_medium_geometry, which realloc calls without a lock): see
      // Span::is_carved_block.
      store_shared(s->carved_blocks, 1u);
      s->inverse = 1;
      s->shift = 0;
      store_shared(s->used, 1u);
      store_shared(s->size_class, std::uint8_t{0});
      store_shared(s->kind, SpanKind::kMedium);
      s->owner.store(h, std::memory_order_release);
      heap_link_span(h, s);
    }
  }
  auto* b = reinterpret_cast<Block*>(s->start);
  if (zero && dirty != 0) {
    zero_dirty_pages(s, size, dirty);
  } else {
    b->key = 0;
  }
  return b;
}

void medium_freed(Heap* h, Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kMedium && s->used == 0 && s->owner.load(std::memory_order_relaxed) == h);
  std::size_t budget = medium_cache_budget();
  std::size_t bytes = run_bytes(s);
  // A run of more than half the budget is not kept: a few big runs would take all of it, and
  // a block of that size costs more to use than its run's claim and release.
  if (bytes > budget / 2) {
    heap_release_span(h, s);
    return;
  }
  medium_cache_shrink(h, budget - bytes, kMediumCacheSlots - 1);
  h->medium_cache[h->medium_cache_count] = s;
  ++h->medium_cache_count;
  h->medium_cache_bytes += bytes;
}

namespace {

// The large stash: the mapping of the last large block a thread allocated and freed, if its
// user part is at most BRISK_LARGE_STASH_BYTES and kMediumMax (a size that could have been a
// medium block: 1-2 MiB at the speed and balanced BRISK_MEDIUM_MAX, a buffer that realloc grew
// past 256 KiB, or anything above a BRISK_MEDIUM_MAX set lower; low-memory keeps none),
// kept for the thread's next large block, which takes it when it fits and uses at least half of
// it (large_alloc_from). Under the heap's slow lock, which
// only its owner takes but for the flushes (medium_cache_flush), so neither side waits in
// practice; the cache's lock is not taken. A program that replaces a buffer of a few hundred KiB
// with a slightly bigger one (a growing string: MMtest strings) frees and takes a mapping per
// step: through the process-wide cache, its threads would wait for each other at its lock and
// take mappings another core last wrote.
LargeMapping stash_take(Heap* h) {
  LargeMapping m = h->large_stash;
  store_shared(h->large_stash.base, static_cast<char*>(nullptr));
  h->large_stash.size = 0;
  return m;
}

// A large block the OS refused to map even after the core gave back its caches' mappings
// (map_aligned_or_flush_caches): the address space may be in chunks emptied by this thread's
// frees, which its heap keeps, or in empty abandoned chunks, which only a trim gives back. One
// brisk_trim, then one more try (RLIMIT_AS: a 96 MiB block after 3.5 million 64-byte blocks were
// freed; operator new's handler loop after the handler freed a reserve). No lock is held here.
void* large_alloc_after_trim(std::size_t size, std::size_t alignment, bool zero, Heap* owner, bool grows) {
  if (process_trim() == 0) return nullptr;
  return large_alloc(size, alignment, zero, owner, grows);
}

}  // namespace

void* large_alloc_here(std::size_t size, std::size_t alignment, bool zero, bool grows) {
  Heap* h = t_heap;
  // A thread's first block may be a large one that its stash could hold: it gets its heap here,
  // as its first medium block would, so that the block can come back to the stash.
  if (h == &g_sentinel_heap && size <= kMediumMax) h = heap_for_this_thread();
  if (h == nullptr || !heap_is_attached(h)) {
    void* p = large_alloc(size, alignment, zero, nullptr, grows);
    return p != nullptr ? p : large_alloc_after_trim(size, alignment, zero, nullptr, grows);
  }
  if (alignment <= kMinAlign && load_shared(h->large_stash.base) != nullptr) {
    HeapSlowLock lock(h);
    if (h->large_stash.base != nullptr) {
      if (void* p = large_alloc_from(h->large_stash, size, zero, h)) {
        stash_take(h);
        return p;
      }
    }
  }
  void* p = large_alloc(size, alignment, zero, h, grows);
  return p != nullptr ? p : large_alloc_after_trim(size, alignment, zero, h, grows);
}

// Only a mapping this thread's heap allocated is stashed: a thread that frees the large blocks
// of others (a consumer) would only hold one back from the threads that allocate them.
void large_free_here(void* p, LargeHeader* lh) {
  Heap* h = t_heap;
  if (heap_is_attached(h) && h->serving) {
    const auto stash = static_cast<std::size_t>(options::get(options::Id::kLargeStashBytes));
    const std::size_t limit = stash < kMediumMax ? stash : kMediumMax;
    // The header is read before the lock, so that every other large free takes no lock of the
    // heap's (the block is the caller's to free); large_free_to checks it again.
    if (lh->owner != h || lh->map_size - kOsPageSize > limit) return large_free(p, lh);
    bool stashed;
    LargeMapping old;
    {
      HeapSlowLock lock(h);
      LargeMapping m;
      stashed = large_free_to(p, lh, limit, h, &m);
      if (stashed) {
        old = stash_take(h);
        h->large_stash.size = m.size;
        store_shared(h->large_stash.base, m.base);
      }
    }
    if (stashed) {
      if (old.base != nullptr) large_give(old);  // outside the heap's lock: the cache may unmap
      return;
    }
  }
  large_free(p, lh);
}

std::size_t medium_cache_flush(Heap* h) {
  std::size_t bytes = h->medium_cache_bytes + h->large_stash.size;
  medium_cache_shrink(h, 0, 0);
  if (h->large_stash.base != nullptr) large_give(stash_take(h));
  return bytes;
}

bool medium_resize_in_place(Span* s, std::size_t new_size) {
  BRISK_ASSERT(s->kind == SpanKind::kMedium && s->used == 1);
  unsigned pages = s->page_count;
  unsigned want = pages_for(new_size);
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  // A block that grows keeps every page of its span, the spare pages of a run taken from the
  // cache included (they are there for this growth); one that shrinks gives back the pages past
  // its new size.
  if (want == pages || (want < pages && new_size >= s->block_size)) {
    set_medium_geometry(s, pages, new_size);
    return true;
  }
  if (want < pages) {
    set_medium_geometry(s, want, new_size);
    // Pages given back to the chunk may be purged before the run claims them again.
    const std::size_t kept_os_pages = (std::size_t{want} << kPageShift) / kOsPageSize;
    if (s->present_os_pages > kept_os_pages) s->present_os_pages = static_cast<std::uint16_t>(kept_os_pages);
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
