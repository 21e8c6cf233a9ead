// A heap's spans: creation (claim_pages_for_span's order of page sources), the list of all of a
// heap's spans, and emptied spans (retained or released); lazy carving is carve.cc's. See
// span_pages.h.
#include "threadcache/span_pages.h"

#include <algorithm>

#include "core/assert.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/report.h"
#include "core/span_holes.h"
#include "threadcache/background.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"
#include "threadcache/purge.h"

namespace brisk {

void heap_rebuild_idle_purged(Heap* h) {
  h->idle_purged = false;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    Span* s = h->installed[c];
    if (s == &g_empty_span || !s->idle_purged) continue;
    // The purge saw no live block, and pointed current[c] away before it looked: since then at
    // most one allocation (a fast path already under way) took a block of s, the head it saw,
    // whose pages it kept; the block may have come back since. Every other block's link and key
    // may now read as zeros, so the free list is made again.
    std::uint32_t live = s->used - s->idle_absorbed;
    if (live == 0) {
      s->free = nullptr;  // carved again from the first block, page by page, as a new span
      store_shared(s->carved_blocks, 0u);
    } else if (live == 1 && s->idle_head != nullptr) {
      Block* head = nullptr;
      for (std::uint32_t i = s->carved_blocks; i-- > 0;) {
        char* p = s->start + std::size_t{i} * s->block_size;
        if (p == reinterpret_cast<char*>(s->idle_head)) continue;  // the live one
        auto* b = reinterpret_cast<Block*>(p);
        FreeCode code = free_code(reinterpret_cast<std::uintptr_t>(p));
        set_link(b, head, code.link_mask);
        b->key = code.key;
        head = b;
      }
      s->free = head;
    } else {
      // More frees than blocks handed out: a block of s freed a second time after the purge
      // (its free key had gone with the page, so the fast path took it for a live block).
      fatal_pointer_error("double free in the span of", s->start,
                          "a block freed twice after its thread's idle memory went back");
    }
    store_shared(s->used, live);
    store_shared(s->resident_pages, std::uint8_t{0});
    s->idle_head = nullptr;
    store_shared(s->idle_purged, false);
    store_shared(s->idle_absorbed, 0u);
  }
}

void heap_link_span(Heap* h, Span* s) {
  s->all_prev = nullptr;
  s->all_next = h->all_spans;
  if (h->all_spans != nullptr) h->all_spans->all_prev = s;
  h->all_spans = s;
  store_shared(h->span_count, h->span_count + 1);
}

void heap_unlink_span(Heap* h, Span* s) {
  if (s->all_prev != nullptr) s->all_prev->all_next = s->all_next; else h->all_spans = s->all_next;
  if (s->all_next != nullptr) s->all_next->all_prev = s->all_prev;
  s->all_prev = s->all_next = nullptr;
  store_shared(h->span_count, h->span_count - 1);
  // Its pages may be another span's by the next flush: its tail stays as it is (resident, and
  // counted by its chunk's record like any released page).
  for (unsigned i = 0; i < h->pending_tail_count; ++i) {
    if (h->pending_tails[i].span == s) {
      h->pending_tails[i] = h->pending_tails[--h->pending_tail_count];
      break;
    }
  }
}

namespace {

bool release_oldest_retained(Heap* h);
bool release_retained_fitting(Heap* h, unsigned pages);
Chunk* take_stale_kept_page(Heap* h, unsigned* first_out, std::uint64_t* dirty);

// Pages for a new span, from the first of: resident free pages in this heap's chunks (for a
// one-page span, one resident where its first carve will write first: chunk.h's os_pages);
// (for a small span) those of an emptied span kept for another class; resident free pages in
// other heaps' chunks (the same way), else any free run in them; an abandoned chunk (adopted);
// any free pages in this heap's chunks; the same after taking the frees queued to other heaps;
// a new chunk.
// Resident pages first everywhere, since a fresh page costs a fault;
// and other heaps' free pages before a new chunk, so free memory is not stranded in chunks
// that only their own heap would reuse (the realloc-chain workload shows the difference in
// resident memory).
Chunk* claim_pages_for_span(Heap* h, unsigned pages, bool small, unsigned need, unsigned* first_out,
                            std::uint64_t* dirty) {
  Chunk* ch = nullptr;
  unsigned first = 0;
  // resident_only: a chunk with a resident run; for a one-page span (need > 0), the first one
  // with a page whose first `need` OS pages are resident (chunk.h's os_pages: a dirty page is
  // often resident only where its last span carved), else the first with any resident page.
  // The page chosen in a chunk is the one that covers the need best.
  auto claim_own = [&](bool resident_only) {
    Chunk* resident = nullptr;
    for (Chunk* c = h->chunks; c != nullptr; c = c->next) {
      if (c->free_pages.load(std::memory_order_relaxed) == 0) continue;
      if (resident_only && !chunk_has_resident_run(c, pages, need)) {
        if (need > 0 && resident == nullptr && chunk_has_resident_run(c, pages)) resident = c;
        continue;
      }
      first = chunk_claim_pages(c, pages, dirty, need);
      if (first != 0) return c;
    }
    if (resident != nullptr) {
      first = chunk_claim_pages(resident, pages, dirty, need);
      if (first != 0) return resident;
    }
    return static_cast<Chunk*>(nullptr);
  };
  ch = claim_own(true);
  // Emptied spans kept for their classes hold resident pages: a new small span takes those of
  // the one kept longest that is big enough before any page that would fault (a string growing
  // through the classes hands each kept span's pages on to the next class instead of touching
  // fresh ones). Not for medium blocks: they would take kept spans one after another, and each
  // class whose span went would then need new pages itself.
  if (ch == nullptr && small && release_retained_fitting(h, pages)) ch = claim_own(true);
  // So do one-page spans kept for classes the thread has left (take_stale_kept_page).
  if (ch == nullptr && small && pages == 1) ch = take_stale_kept_page(h, &first, dirty);
  if (ch == nullptr && need > 0) ch = chunk_claim_shared(h, pages, true, &first, dirty, need);
  if (ch == nullptr) ch = chunk_claim_shared(h, pages, true, &first, dirty);
  // The resident pages of a span kept whole for another class (orphans.h), before any fresh one.
  if (ch == nullptr && small && release_kept_span_for_pages(pages)) {
    ch = claim_own(true);
    if (ch == nullptr) ch = chunk_claim_shared(h, pages, true, &first, dirty);
  }
  if (ch == nullptr) {
    Chunk* c = chunk_adopt(h);
    if (c != nullptr) {
      chunk_list_push(h->chunks, c);
      first = chunk_claim_pages(c, pages, dirty);
      if (first != 0) ch = c;
    }
  }
  if (ch == nullptr) ch = claim_own(false);
  if (ch == nullptr) ch = chunk_claim_shared(h, pages, false, &first, dirty);
  // Before the process grows: blocks freed by other threads and queued to an owner that is not
  // running (blocked, or descheduled on a machine with more threads than cores) may fill whole
  // spans. On mstress (10 threads, 2 cores) taking them here cut page faults by a third.
  if (ch == nullptr && reclaim_other_queues(h) != 0) {
    ch = claim_own(false);
    if (ch == nullptr) ch = chunk_claim_shared(h, pages, false, &first, dirty);
  }
  if (ch == nullptr) {
    Chunk* c = chunk_create(h);
    if (c == nullptr) return nullptr;
    chunk_list_push(h->chunks, c);
    // The new chunk is visible to other heaps already; in the rare case they took its pages,
    // the caller tries again.
    first = chunk_claim_pages(c, pages, dirty);
    if (first != 0) ch = c;
  }
  *first_out = first;
  return ch;
}

}  // namespace

Span* span_create(Heap* h, unsigned pages, std::uint64_t* dirty, bool small, unsigned need) {
  unsigned first = 0;
  Chunk* ch = nullptr;
  for (int attempt = 0; attempt < 4 && ch == nullptr; ++attempt)
    ch = claim_pages_for_span(h, pages, small, pages == 1 ? need : 0, &first, dirty);
  if (ch == nullptr) return nullptr;
  Span* s = &ch->spans[first];
  s->first_page = static_cast<std::uint8_t>(first);
  store_shared(s->page_count, static_cast<std::uint8_t>(pages));
  s->start = ch->page_address(first);
  s->free = nullptr;
  s->listed = false;
  s->prev = s->next = nullptr;
  for (unsigned i = first; i < first + pages; ++i) ch->page_span[i] = s;
  return s;
}

namespace {

// s's pages that h released in one of its last kRecentReleases releases of a span of s's class,
// bit i for s's page i.
std::uint64_t recently_released_pages(const Heap* h, const Span* s, unsigned c) {
  const Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  std::uint64_t pages = 0;
  for (const Heap::RecentRelease& r : h->recent_releases)
    if (r.chunk == ch && r.size_class == c) pages |= r.pages;
  return (pages >> s->first_page) & ((std::uint64_t{1} << s->page_count) - 1);
}

// The pages of a new small span past what its first carve touches (the OS page of its first
// block, or the block) go back to the OS if any of them held data (BRISK_PURGE_SPAN_TAILS), but
// not when every such page is one this heap released in its last few releases of a span of the
// same class (of any class, realloc's low-memory peak rose 1.19x): a loop that
// needs one span more of a class than it keeps releases and recreates that span every round,
// and giving its tail back each time made every round fault it in again (48 KiB blocks, 11 a
// round: 17 us a round against 0.26 in balanced mode). Called under h's slow lock (alloc_refill),
// which guards recent_releases and the pending tails.
//
// The tail waits in the heap's pending tails, which go back together (heap_flush_span_tails):
// a madvise that drops resident pages interrupts every other CPU running the process to flush
// its TLB, about 90 us a call on the AMD EPYC VM with another thread running, and one
// process_madvise of 16 ranges costs about what two madvise calls do (platform::decommit_all).
// Giving each tail back at once made low-memory mode take 3.3x balanced's time on churn. The
// pages carving reaches meanwhile stay: they are in use, and would have faulted back in.
void defer_span_tail(Heap* h, Span* s, unsigned c) {
  const SizeClassInfo& info = kClasses[c];
  auto start = reinterpret_cast<std::uintptr_t>(s->start);
  std::uintptr_t from = round_to_os_page(start + info.size);
  std::uintptr_t end = start + (std::size_t{info.span_pages} << kPageShift);
  if (from >= end) return;  // one block fills the span (the 64 KiB class): no tail
  unsigned first_page = static_cast<unsigned>((from - start) >> kPageShift);  // 64 KiB page of `from`
  const std::uint64_t dirty = s->resident_pages;
  if ((dirty >> first_page) == 0) return;  // the tail never held data: it is not resident
  if (((dirty & ~recently_released_pages(h, s, c)) >> first_page) == 0) return;  // hot: kept
  if (h->pending_tail_count == 0) h->pending_tails_since_ms = platform::now_ms();
  h->pending_tails[h->pending_tail_count++] = Heap::PendingTail{s, from};
  if (h->pending_tail_count == Heap::kPendingTails) heap_flush_span_tails(h);
}

// The most 64 KiB pages a small span has: Span::resident_pages holds one bit per page.
constexpr unsigned max_small_span_pages() {
  unsigned most = 0;
  for (const SizeClassInfo& info : kClasses) most = info.span_pages > most ? info.span_pages : most;
  return most;
}
static_assert(max_small_span_pages() <= 8 && kMaxSmallSpanPages <= 8, "Span::resident_pages has 8 bits");

}  // namespace

Span* span_new_small(Heap* h, unsigned c) {
  const SizeClassInfo& info = kClasses[c];
  std::uint64_t dirty = 0;
  // What its first carve touches: the first block's OS pages (one for classes up to 4 KiB).
  const auto need = static_cast<unsigned>(round_to_os_page(info.size) / kOsPageSize);
  static_assert(kSmallMax <= kPageSize, "a need is at most a page's 16 OS pages");
  Span* s = span_create(h, info.span_pages, &dirty, true, need);
  if (s == nullptr) return nullptr;
  store_shared(s->resident_pages, static_cast<std::uint8_t>(dirty));
  store_shared(s->used, 0u);
  store_shared(s->carved_blocks, 0u);
  store_shared(s->block_size, info.size);  // read by the statistics while medium (span.h)
  s->span_bytes = info.capacity * info.size;
  s->inverse = info.divisor.inverse;
  s->shift = info.divisor.shift;
  store_shared(s->size_class, static_cast<std::uint8_t>(c));
  store_shared(s->kind, SpanKind::kSmall);
  s->owner.store(h, std::memory_order_release);
  heap_link_span(h, s);
  if (dirty != 0 && options::get(options::Id::kPurgeSpanTails) != 0) defer_span_tail(h, s, c);
  return s;
}

std::atomic<void (*)(Heap* h, unsigned ranges, std::size_t calls)> g_span_tails_flushed_test_hook{nullptr};

void heap_age_span_tails(Heap* h) {
  // A tail the program has not carved into for a purge delay is one the decay would give back.
  if (h->pending_tail_count != 0 &&
      platform::now_ms() - h->pending_tails_since_ms >= static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs)))
    heap_flush_span_tails(h);
}

std::size_t heap_flush_span_tails(Heap* h) {
  const unsigned n = h->pending_tail_count;
  if (n == 0) return 0;
  static_assert(Heap::kPendingTails <= platform::kMaxDecommitRanges);
  platform::PageRange ranges[Heap::kPendingTails];
  Span* spans[Heap::kPendingTails];
  unsigned k = 0;
  for (unsigned i = 0; i < n; ++i) {
    const Heap::PendingTail& t = h->pending_tails[i];
    Span* s = t.span;
    BRISK_ASSERT(s->owner.load(std::memory_order_relaxed) == h && s->kind == SpanKind::kSmall);
    // No block lies past the carved part (carving is h's, under this lock): the OS pages it has
    // reached hold blocks and stay.
    const auto start = reinterpret_cast<std::uintptr_t>(s->start);
    const std::uintptr_t carved = round_to_os_page(start + s->carved_bytes());
    const std::uintptr_t from = carved > t.from ? carved : t.from;
    const std::uintptr_t end = start + (std::size_t{s->page_count} << kPageShift);
    if (from >= end) continue;
    ranges[k] = platform::PageRange{reinterpret_cast<void*>(from), end - from};
    spans[k++] = s;
  }
  h->pending_tail_count = 0;
  const std::size_t calls = platform::decommit_all(ranges, k);
  if (auto hook = g_span_tails_flushed_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr))
    hook(h, k, calls);
  std::size_t bytes = 0;
  for (unsigned i = 0; i < k; ++i) {
    bytes += ranges[i].size;
    span_forget_tail(spans[i], reinterpret_cast<std::uintptr_t>(ranges[i].start));
  }
  return bytes;
}

namespace {

// Resets an empty span's descriptor (its pages stay claimed).
void reset_span(Span* s) {
  BRISK_ASSERT(s->kind != SpanKind::kUnused && s->used == 0 && !s->listed && !s->idle_purged);
  store_shared(s->kind, SpanKind::kUnused);
  BRISK_ASSERT(!s->stays_when_empty);  // uninstalled before its release (set_current)
  s->free = nullptr;
  store_shared(s->used, 0u);
  store_shared(s->carved_blocks, 0u);
  store_shared(s->resident_pages, std::uint8_t{0});
  store_shared(s->hole_pages, std::uint64_t{0});
  s->span_bytes = 0;
  s->present_os_pages = 0;
  s->owner.store(nullptr, std::memory_order_relaxed);
}

// The OS pages of s that may have held data since its pages were claimed (bit i for its i-th),
// for its chunk's os_pages record (chunk.h): a small span's carved part (carve writes every
// block start, and a block's user writes within it; pages resident past it from an earlier use
// keep their record), a medium block's pages all. Exact for blocks of up to 4 KiB, whose carved
// part has a block start in every OS page; an upper bound for larger ones, which a program may
// write only in part (asking the kernel with mincore at each such release made larson take 1.5x
// its time).
}  // namespace

std::uint64_t written_os_pages(const Span* s) {
  if (s->kind != SpanKind::kSmall) return kAllWritten;
  const std::size_t os_pages = round_to_os_page(s->carved_bytes()) / kOsPageSize;
  return os_pages >= 64 ? kAllWritten : (std::uint64_t{1} << os_pages) - 1;
}

// Resets a span's descriptor and gives its pages back to the chunk.
void release_span_pages(Span* s) {
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  unsigned first = s->first_page, count = s->page_count;
  const std::uint64_t written = written_os_pages(s);
  reset_span(s);
  chunk_release_span_pages(ch, first, count, written);
}

std::size_t heap_release_spares(Heap* h) {
  std::size_t bytes = 0;
  for (Span* s : h->spare) {
    if (s == nullptr) continue;
    bytes += std::size_t{s->page_count} << kPageShift;
    heap_release_span(h, s);
  }
  return bytes;
}

namespace {

// Whether class c is the one h refilled last: a span of c that empties now was emptied by a
// thread cycling through spans of that class, as a string grown by realloc does in a class of
// one block a span (the new block's span made, then the old one's emptied), which leaves the
// class for the next soon. Such a span goes back to its chunk, where the next class's span
// takes its page at once; kept (as the class's spare, or in its central pool), every class the
// thread passed through held a second span until the purge delay (MMtest strings, 10 threads:
// 1.19x the peak RSS, 1.09x the time). (refills != 0: a heap that has refilled nothing yet,
// freeing the blocks it inherited, would match every class.)
bool heap_cycles_class(const Heap* h, unsigned c) { return h->refills != 0 && h->refilled_at[c] == h->refills; }

// Counts a span's bytes gone from h towards its next purge check, and runs the check when due.
void note_released(Heap* h, std::size_t bytes) {
  h->released_since_purge += bytes;
  std::size_t keep = static_cast<std::size_t>(options::get(options::Id::kPurgeBytes));
  if (h->released_since_purge >= keep && !h->purging) heap_purge(h, keep);
}

}  // namespace

void heap_release_span(Heap* h, Span* s) {
  BRISK_ASSERT(s->used == 0 && s->owner.load(std::memory_order_relaxed) == h && s != &g_empty_span);
  if (s->kind == SpanKind::kSmall && h->spare[s->size_class] == s) h->spare[s->size_class] = nullptr;
  if (s->listed) h->available[s->size_class].remove(s);
  heap_unlink_span(h, s);
  std::size_t bytes = std::size_t{s->page_count} << kPageShift;
  if (s->kind == SpanKind::kSmall) {
    h->recent_releases[h->recent_next] =
        Heap::RecentRelease{chunk_of(reinterpret_cast<std::uintptr_t>(s->start)),
                            ((std::uint64_t{1} << s->page_count) - 1) << s->first_page, s->size_class};
    h->recent_next = static_cast<std::uint8_t>((h->recent_next + 1) % Heap::kRecentReleases);
  }
  release_span_pages(s);
  note_released(h, bytes);
}

bool heap_keep_empty_span(Heap* h, Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kSmall && s->used == 0 && s->owner.load(std::memory_order_relaxed) == h);
  // A debug heap's span is kept too. The debug heap keeps every span that holds one of its
  // blocks (debug_switch.h), and an empty span holds none: a quarantined block still counts in
  // `used` until it leaves the quarantine. Released to its chunk, the span's written pages would
  // go to the debug heap's next new span, which gives back its tail (BRISK_PURGE_SPAN_TAILS) and
  // faults it in again as it carves (churn in debug mode: 55,000 page faults that way, 27,000
  // with the span kept, 9,400 in release mode).
  if (!kept_span_fits(s)) return false;
  // Nor one that a thread empties while it cycles through spans of its class
  // (heap_cycles_class), through its thread heap or its debug heap (which serves no thread of
  // its own: `serving` stays false).
  const unsigned c = s->size_class;
  if ((h->serving || h->is_debug) && heap_cycles_class(h, c)) return false;
  if (h->spare[c] == s) h->spare[c] = nullptr;
  if (s->listed) h->available[c].remove(s);
  heap_unlink_span(h, s);
  const std::size_t bytes = std::size_t{s->page_count} << kPageShift;
  keep_empty_span(s);
  note_released(h, bytes);  // gone from the heap as a released span is: the purge checks' pace
  return true;
}

namespace {

// Gives back the current span of class c if it is empty.
void release_if_empty(Heap* h, unsigned c) {
  Span* s = h->installed[c];
  if (s != &g_empty_span && s->used == 0) {
    set_current(h, c, &g_empty_span);
    heap_release_span(h, s);
  }
}

}  // namespace

void heap_release_empty_spans(Heap* h) {
  for (unsigned c = 0; c < kNumClasses; ++c) release_if_empty(h, c);
  heap_release_spares(h);
}

namespace {

// Carved bytes of the kept classes' current spans and of every class's spare: what they hold
// resident at most (lazy carving touches no page past the carved blocks, but for speed mode's
// populated batches, populate_carved; pages a span was given already resident are not counted).
std::size_t retained_carved_bytes(const Heap* h) {
  std::size_t bytes = 0;
  for (unsigned k = 1; k <= h->retained_count; ++k) {
    const Span* s = h->installed[h->retained_classes[(h->retained_next + kRetainedLargeSpans - k) % kRetainedLargeSpans]];
    if (s != &g_empty_span) bytes += s->carved_bytes();
  }
  for (const Span* spare : h->spare)
    if (spare != nullptr) bytes += spare->carved_bytes();
  return bytes;
}

// Keeps an emptied multi-page current span of class c, in a FIFO of at most BRISK_RETAINED_SPANS
// classes (a strategy lever, at most kRetainedLargeSpans) whose spans hold at most
// BRISK_RETAINED_BYTES carved bytes when a class joins: past either, the class kept longest ago
// gives its current span back if that is still empty. A class is kept at most once, so
// alloc/free ping-pong over as many classes as fit never releases and recreates a span.
void retain_empty_span(Heap* h, unsigned c) {
  if (h->retained[c]) return;
  auto limit = static_cast<unsigned>(options::get(options::Id::kRetainedSpans));
  auto budget = static_cast<std::size_t>(options::get(options::Id::kRetainedBytes));
  std::size_t bytes = h->installed[c]->carved_bytes();
  if (limit == 0 || bytes > budget) {
    release_if_empty(h, c);
    return;
  }
  while (h->retained_count != 0 && (h->retained_count >= limit || retained_carved_bytes(h) + bytes > budget))
    release_oldest_retained(h);
  unsigned slot = h->retained_next;
  h->retained_next = static_cast<std::uint8_t>((slot + 1) % kRetainedLargeSpans);
  ++h->retained_count;
  h->retained_classes[slot] = static_cast<std::uint8_t>(c);
  h->retained[c] = true;
  note_installed(h, c);
}

// Takes the k-th newest class (k = retained_count: the oldest) out of the FIFO, the newer ones
// moving up a slot, and gives back its span if that is still empty.
void release_retained(Heap* h, unsigned k) {
  unsigned c = h->retained_classes[(h->retained_next + kRetainedLargeSpans - k) % kRetainedLargeSpans];
  for (unsigned j = k; j > 1; --j) {
    unsigned to = (h->retained_next + kRetainedLargeSpans - j) % kRetainedLargeSpans;
    h->retained_classes[to] = h->retained_classes[(to + 1) % kRetainedLargeSpans];
  }
  h->retained_next = static_cast<std::uint8_t>((h->retained_next + kRetainedLargeSpans - 1) % kRetainedLargeSpans);
  --h->retained_count;
  h->retained[c] = false;
  note_installed(h, c);
  if (h->spare[c] != nullptr) heap_release_span(h, h->spare[c]);
  release_if_empty(h, c);
}

// Gives back the span kept longest ago that is still empty and has at least `pages` pages.
// False: there is none.
bool release_retained_fitting(Heap* h, unsigned pages) {
  for (unsigned k = h->retained_count; k > 0; --k) {
    Span* s = h->installed[h->retained_classes[(h->retained_next + kRetainedLargeSpans - k) % kRetainedLargeSpans]];
    if (s == &g_empty_span || s->used != 0 || s->page_count < pages) continue;
    release_retained(h, k);
    return true;
  }
  return false;
}

// A stale kept span. A class keeps its emptied one-page span as its current span
// (free_local_adjust), so a thread that leaves a class -- a string growing through the
// classes, the odd block of 1-64 KiB -- leaves a resident page behind in each, and its next new
// span of another class faults fresh pages in while the kept ones wait for their decay
// (heap_release_stale_kept_spans: two purge checks, which a thread releasing little reaches
// late). So before any page that would fault, a new one-page span takes the page of the kept
// one-page span whose class has gone longest without a refill, if that is at least
// take_kept_after refills (the owner's slow path, under HeapSlowLock: the class's current span
// goes to g_empty_span and its next allocation gets a new span). The threshold adapts
// (heap_note_refill): at a fixed 8, MMtest small, whose 13 classes take turns, took a span from
// the class refilled 8-12 refills before and gave it one back soon after, on almost every
// refill (MMtest small 7x the time, small-raw 20x); MMtest strings needs it that low (peak
// 13.9 MiB at 8, 18.3 at 64, 21.5 at 256, against 20.1 without).
// The page passes from the kept span to the new one without going back to its chunk, wherever
// the chunk is: no other heap can take it in between, and the chunk, which the page keeps
// mapped, cannot go away. (Released and searched for again, a page in another heap's chunk was
// missed by the search of the heap's own chunks: 39% of such takes in a threaded test lost the
// class its span for nothing; taking only spans in the heap's own chunks lost MMtest strings'
// gain on 10 threads.) Only a span with a carved block: one the idle purge gave back in place
// (rebuilt by HeapSlowLock, nothing carved) holds no resident page. Returns the chunk, with
// *first_out and *dirty set as chunk_claim_pages sets them, or nullptr.
Chunk* take_stale_kept_page(Heap* h, unsigned* first_out, std::uint64_t* dirty) {
  unsigned stalest = kNumClasses;
  std::uint32_t most = 0;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const Span* s = h->installed[c];
    if (s == &g_empty_span || s->used != 0 || s->page_count != 1 || s->carved_blocks == 0) continue;
    const std::uint32_t unrefilled = h->refills - h->refilled_at[c];
    if (unrefilled < h->take_kept_after || unrefilled < most) continue;
    stalest = c;
    most = unrefilled;
  }
  if (stalest == kNumClasses) return nullptr;
  Span* s = h->installed[stalest];
  // A spare of the class (keep_spare: the classes above 16 KiB keep one) stays the class's, on
  // its list: the class's next allocation takes it.
  BRISK_ASSERT(!s->listed && s != h->spare[stalest]);
  h->kept_taken_at[stalest] = h->refills | 1;  // never 0, which means "not taken"
  set_current(h, stalest, &g_empty_span);
  heap_unlink_span(h, s);
  *first_out = s->first_page;
  if (dirty != nullptr) *dirty = 1;  // the page held the class's carved blocks
  Chunk* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  chunk_note_written(ch, s->first_page, 1, written_os_pages(s));
  reset_span(s);
  return ch;
}

// Gives back the span of the class kept longest ago, if still empty. False: none is kept.
bool release_oldest_retained(Heap* h) {
  if (h->retained_count == 0) return false;
  release_retained(h, h->retained_count);
  return true;
}

}  // namespace

void heap_release_stale_kept_spans(Heap* h) {
  BRISK_ASSERT(!h->purging && t_heap == h && h->slow_depth != 0 && !h->idle_purged);
  h->purging = true;  // the releases below start no purge of their own
  // A current span kept empty is taken away from the fast path at one check (current[c] at
  // g_empty_span, installed[c] still s, as the idle purge and a debug switch leave it): the next
  // allocation of the class puts it back (alloc_refill), one slow path a check. Still away and
  // empty at the next check, nothing allocated from it for a whole delay: it goes back.
  // True: class c's span is empty and was off already (unused since the previous check); an
  // empty one still on is taken off. (idle_purged: HeapSlowLock rebuilt every such span before
  // this runs; tested all the same, since releasing one would be unsound.)
  auto unused_since_last_check = [h](unsigned c) {
    Span* s = h->installed[c];
    if (s == &g_empty_span || s->used != 0 || s->idle_purged) return false;
    if (current_span(h, c) == &g_empty_span) return true;
    std::atomic_ref<Span*>(h->current[c]).store(&g_empty_span, std::memory_order_relaxed);
    return false;
  };
  // A spare is touched only here and under the lock: its stamp says when it became the spare
  // (keep_spare), and popping it clears spare[c]. Stamps are never ahead of the count, so "not
  // this check's" is "before it" (one made exactly 65,536 checks ago stays a check more).
  const auto now = static_cast<std::uint16_t>(h->purge_checks);
  // The retained classes, oldest first: taking the k-th out leaves the newer ones where they are.
  for (unsigned k = h->retained_count; k > 0; --k) {
    unsigned c = h->retained_classes[(h->retained_next + kRetainedLargeSpans - k) % kRetainedLargeSpans];
    Span* spare = h->spare[c];
    if (spare != nullptr && spare->used == 0 && spare->emptied_at_check != now)
      heap_release_span(h, spare);  // clears spare[c]
    if (unused_since_last_check(c)) release_retained(h, k);
  }
  for (unsigned c = 0; c < kNumClasses; ++c) {
    if (h->retained[c]) continue;
    Span* spare = h->spare[c];
    if (spare != nullptr && spare->used == 0 && spare->emptied_at_check != now) heap_release_span(h, spare);
    if (unused_since_last_check(c)) release_if_empty(h, c);
  }
  ++h->purge_checks;
  h->purging = false;
}

namespace {

// A retained class's span that empties while another is its current span stays, listed, as
// the class's spare (one at most, within BRISK_RETAINED_BYTES with the kept spans). A loop
// that takes one span and a few blocks more of a class and frees them all would otherwise
// release that span every round and create it again the next (4-block spans of a 48 KiB
// class: 165 ns a block instead of 46; in low-memory mode, whose new spans give their tails
// back, 24 us). So does a running thread's one-page span of a class above 16 KiB (1-3 blocks
// a span, which empty often), unless the thread is cycling through spans of its class
// (heap_cycles_class): its next block of the class then takes it back without the central
// pool's lock, where it would go kept otherwise (heap_keep_empty_span: MMtest medium-raw on 10
// threads, whose blocks move class by class through realloc, took 1.22x the time, with 600,000
// pool lock acquisitions, 9% of them contended). Not the smaller classes' (a full 64 KiB page
// each, which their spans rarely empty: spares of them raised larson-classic's peak by 1.07x),
// nor a debug heap's, nor with BRISK_KEPT_SPAN_BYTES at 0 (low-memory's: a spare per class and
// thread raised its peaks by 1.05-1.19x, prodcons's most). Returns false: not kept.
bool keep_spare(Heap* h, Span* s) {
  unsigned c = s->size_class;
  if (h->spare[c] != nullptr) return false;
  if (h->retained[c]) {
    if (!s->listed) return false;
  } else if (s->page_count != 1 || s->block_size <= kSmallMax / 4 || h->is_debug || !h->serving ||
             heap_cycles_class(h, c) || options::get(options::Id::kKeptSpanBytes) == 0) {
    return false;
  }
  auto budget = static_cast<std::size_t>(options::get(options::Id::kRetainedBytes));
  if (retained_carved_bytes(h) + s->carved_bytes() > budget) return false;
  if (!s->listed) h->available[c].push(s);
  h->spare[c] = s;
  s->emptied_at_check = static_cast<std::uint16_t>(h->purge_checks);
  return true;
}

// A span of h that empties while its class has no span installed (one h adopted from a thread
// that exited, free_claimed, or one left listed when the class's own went back) becomes the
// class's span, as an emptied current span stays (free_local_adjust): h's next allocation of the
// class takes its blocks, carved and resident, where releasing it made that allocation claim
// pages and carve a new span. A thread that inherits its predecessor's blocks often frees them
// all first (the churn workload; README "Thread exit"). Installed off the fast path (current
// stays at g_empty_span, as after a purge check): alloc_refill puts it on, where a debug switch
// is ordered with it. Stamped as refilled now, so take_stale_kept_page does not hand its page to
// another class before this one could use it. A span of more than one page stays only as a
// retained class's emptied span does (retain_empty_span: BRISK_RETAINED_SPANS and _BYTES), else
// it goes back at once. It goes back at the heap's next purge check if no allocation took it by
// then (being off the fast path already, it counts as unused since the check before:
// heap_release_stale_kept_spans), at the idle purge, or at the thread's exit. Only while h
// serves a thread: a heap detaching (heap_detach frees its queue after resetting its classes,
// then releases every span) or a debug heap parked in the pool must not be left naming a span.
void install_emptied(Heap* h, Span* s) {
  const unsigned c = s->size_class;
  if (s->listed) h->available[c].remove(s);
  BRISK_ASSERT(h->installed[c] == &g_empty_span);
  h->installed[c] = s;
  note_installed(h, c);
  h->refilled_at[c] = h->refills;
  if (s->page_count > 1) retain_empty_span(h, c);
}

}  // namespace

void free_local_adjust(Span* s, Heap* h) {
  // This free's own decrement made used 0, so no block of s is queued to h either (used counts
  // them): a reclaim (background.cc) leaves s alone, and its fields can be read before taking
  // the lock. (Reading used here instead would not do: a reclaim that released s sets it to 0.)
  // The class's current span stays even when empty, so alloc/free ping-pong stays on the fast
  // path: a one-page span without more ado, a bigger one once its class is among the retained.
  // Either goes back if no allocation takes it for a purge delay (heap_release_stale_kept_spans).
  // The free returned before calling here for those (Span::stays_when_empty says so, and the
  // checked build asserts that it did). The test stays all the same: a flag found false
  // otherwise (a free in a signal handler that interrupted set_current between its stores,
  // say) would take the path below, which would retain a one-page class and push a retained
  // class's span out; here it only costs the call.
  const bool stays = stays_installed_when_empty(h, s);
  BRISK_ASSERT(!stays);
  if (stays) return;
  HeapSlowLock lock(h);
  if (s->kind == SpanKind::kSmall && h->installed[s->size_class] == s) {
    retain_empty_span(h, s->size_class);
    return;
  }
  if (s->kind == SpanKind::kSmall && keep_spare(h, s)) return;
  if (s->kind == SpanKind::kSmall && h->serving && h->installed[s->size_class] == &g_empty_span)
    return install_emptied(h, s);
  if (s->kind == SpanKind::kMedium) return medium_freed(h, s);
  if (heap_keep_empty_span(h, s)) return;
  heap_release_span(h, s);
}

void free_local_refilled(Span* s, Heap* h) {
  // The class's current span needs no lock: only this thread installs a span in h, and no
  // other thread releases or lists an installed one (the reclaim leaves them alone,
  // background.cc), so s is still h's and stays off the lists. Read with load_shared all the
  // same: were s not installed, a reclaim may have released it since the decrement and another
  // heap may be setting it up. A full current span that gets a block back is what a thread
  // whose live blocks of the class sit at a span's boundary meets on every free (a malloc
  // takes the last block, the free gives it back): the lock doubled such a pair's time (13.5
  // ns against 6.1 for the same loop off the boundary, brisk-pair-loop's kind of loop with
  // 1,023 blocks of 64 B held). An idle purge's rebuild waits for the next slow path: it makes
  // the free list again from the counts, whatever frees came in between.
  if (const unsigned c = load_shared(s->size_class);
      c < kNumClasses && h->installed[c] == s && load_shared(s->kind) == SpanKind::kSmall) {
    if (!h->foreign_always) h->foreign_wanted[c] = false;  // as below
    return;
  }
  // s's other blocks may all sit in h's queue, and a reclaim may have taken them and released s
  // between this free's decrement and here: only s's owner, read under the lock, says whether
  // s is still h's. Nothing else of s is read before, but for the class and kind above.
  HeapSlowLock lock(h);
  if (s->owner.load(std::memory_order_relaxed) != h) return;
  if (s->kind == SpanKind::kSmall && !s->listed && h->installed[s->size_class] != s)
    h->available[s->size_class].push(s);
  // Its own blocks come back: the thread no longer grows in the class (foreign_cache.h).
  if (s->kind == SpanKind::kSmall && !h->foreign_always) h->foreign_wanted[s->size_class] = false;
}

}  // namespace brisk
