// Lazy carving of a small span's blocks, one OS page at a time, and how the fresh OS page a carve
// writes first is made present (core/page_cost.h). See span_pages.h.
#include <algorithm>

#include "core/assert.h"
#include "core/chunk.h"
#include "core/free_key.h"
#include "core/options.h"
#include "core/page_cost.h"
#include "core/platform.h"
#include "core/span.h"
#include "threadcache/span_pages.h"

namespace brisk {

namespace {

// Whether OS page p of small span s is unfaulted as far as brisk knows: its 64 KiB page was
// clean when s claimed it (Span::resident_pages), or it was dirty and its chunk's os_pages
// record says this OS page held no data. Carving runs front to back, so no earlier carve of s
// wrote past the carved part. A hint either way: a page the kernel reclaimed since (MADV_FREE)
// reads as resident and faults as before; one wrongly read as fresh costs a system call that
// finds it present.
bool os_page_fresh(const Span* s, const Chunk* ch, std::uintptr_t p) {
  const unsigned page = static_cast<unsigned>((p >> kPageShift) & (kPagesPerChunk - 1));
  if (((s->resident_pages >> (page - s->first_page)) & 1) == 0) return true;
  const auto os_page = static_cast<unsigned>((p & (kPageSize - 1)) / kOsPageSize);
  return ((ch->os_pages[page].load(std::memory_order_relaxed) >> os_page) & 1) == 0;
}

// The OS page a carve of `bytes` of blocks from `first` writes first, if it is fresh, made
// present the way that costs less here (core/page_cost.h): one system call (platform::populate)
// or the page fault of a write, one page in 8 timed for the measurement. A carve holds at most one
// OS page start: up to 4 KiB, its blocks end within the page of `first` unless one block
// crosses that page's end and is carved alone; above 4 KiB, it cuts one block, whose first 16
// bytes it writes. That page start is the first at or after `first`: a carve that starts inside
// a page starts where an earlier carve's block reached, and that carve made the page present.
// Above 4 KiB only a block that starts a page asks (one starting inside a page shares it with
// the block before, which the program may have written already), and for that page only: a
// program may write a big block only in part, and the rest is its to fault.
// With BRISK_POPULATE n above 1 (speed), a span of a class up to 4 KiB (one 64 KiB page) that
// has carved 4 OS pages asks for the next ones n at a time, from a multiple of n (or the first
// fresh page after one that is not) to the next: 5.7 us a page in calls of 4 on the machine
// where that was measured. The carves that reach a batch's later pages ask for nothing (and
// fault them in, where the batch's first page was faulted in). Those pages are fresh as a rule
// (a page's record is mostly the union of carved parts, which start at the page's start); where
// not (a span rebuilt after an idle purge in place, whose kept head leaves a gap), or where the
// lever changed in the middle of a span, a call finds pages present or a page faults as
// before: populate never changes contents. A span that stops growing keeps up to n - 1 such
// pages resident, which its carved part and so its release's record do not count.
void populate_carved(const Span* s, std::uintptr_t first, std::size_t bytes) {
  const auto n = static_cast<unsigned>(options::get(options::Id::kPopulate));
  if (n == 0) return;
  const bool up_to_os_page = s->block_size <= kOsPageSize;  // every page the carved blocks reach is asked for
  const std::uintptr_t page = round_to_os_page(first);
  const std::uintptr_t end = up_to_os_page ? first + bytes : first + 1;
  if (page >= end) return;
  BRISK_ASSERT(end - page <= kOsPageSize);
  const Chunk* ch = chunk_of(first);
  if (!os_page_fresh(s, ch, page)) return;
  const auto start = reinterpret_cast<std::uintptr_t>(s->start);
  const auto j = static_cast<unsigned>((page - start) / kOsPageSize);  // the span's OS page
  constexpr unsigned kGrowing = 4;  // OS pages a span carves before its pages go n at a time
  unsigned pages = 1;
  if (n > 1 && up_to_os_page && j >= kGrowing) {
    // Batches start at kGrowing and at the multiples of n past it, or at a fresh page whose
    // predecessor is not. Inside one an earlier carve asked for: nothing to ask.
    const unsigned batch = std::max(j - j % n, kGrowing);
    if (j != batch && os_page_fresh(s, ch, page - kOsPageSize)) return;
    const auto span_end = static_cast<unsigned>(round_to_os_page(s->span_bytes) / kOsPageSize);
    pages = std::min((j / n + 1) * n, span_end) - j;
  }
  const page_cost::Way way = page_cost::choose(page);
  const bool timed = page_cost::is_timed_page(page);
  const std::uint64_t t0 = timed ? platform::now_ns() : 0;
  if (way == page_cost::Way::kFault) {
    if (!timed) return;  // faulted in by the first write: this carve's, or the program's
    // The byte written lies in a block this carve cuts (from `first` on, past which `page` is),
    // so no data is there yet; carve writes its link and key after.
    *reinterpret_cast<volatile char*>(page) = 0;
    page_cost::record(page_cost::Way::kFault, platform::now_ns() - t0);
    return;
  }
  if (platform::populate(reinterpret_cast<void*>(page), std::size_t{pages} * kOsPageSize) && timed)
    page_cost::record(page_cost::Way::kPopulate, (platform::now_ns() - t0) / pages);
}

}  // namespace

// Lazy carving: a span's blocks are cut (linked into its free list) one OS page at a time, up
// to the end of the page holding the next block, so a fresh span touches only the pages its
// blocks are handed out from: a page fault costs far more than carving a page's blocks, and
// carving further ahead faults in pages that no block has used yet.
void carve(Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kSmall && !s->fully_carved());
  std::uint32_t bs = s->block_size;
  std::uint32_t remaining = (s->span_bytes - s->carved_bytes()) / bs;
  char* first = s->start + s->carved_bytes();
  auto page_end = (reinterpret_cast<std::uintptr_t>(first) | (kOsPageSize - 1)) + 1;
  std::uint32_t n = static_cast<std::uint32_t>((page_end - reinterpret_cast<std::uintptr_t>(first)) / bs);
  if (n == 0) n = 1;
  if (n > remaining) n = remaining;
  populate_carved(s, reinterpret_cast<std::uintptr_t>(first), std::size_t{n} * bs);
  char* p = first;
  for (std::uint32_t i = 0; i < n; ++i, p += bs) {
    auto* b = reinterpret_cast<Block*>(p);
    FreeCode code = free_code(reinterpret_cast<std::uintptr_t>(p));
    set_link(b, i + 1 < n ? reinterpret_cast<Block*>(p + bs) : s->free, code.link_mask);
    // A never-handed-out block carries the free key too: freeing it is caught as a double free.
    b->key = code.key;
  }
  s->free = reinterpret_cast<Block*>(first);
  store_shared(s->carved_blocks, s->carved_blocks + n);
}

}  // namespace brisk
