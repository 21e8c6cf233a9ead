// Span holes. See span_holes.h.
#include "core/span_holes.h"

#include <algorithm>
#include <atomic>
#include <bit>

#include "core/assert.h"
#include "core/chunk.h"
#include "core/config.h"
#include "core/free_key.h"
#include "core/platform.h"
#include "core/report.h"

namespace brisk {

namespace {

constexpr std::size_t kMaxSpanBlocks = kMaxSmallSpanPages * kPageSize / kMinAlign;
constexpr unsigned kMaxSpanOsPages = kMaxSmallSpanPages * kPageSize / kOsPageSize;
static_assert(kMaxSpanOsPages <= 64, "Span::hole_pages has a bit for each OS page of a small span");

// The OS pages (bit i: the span's i-th) that block j of s touches.
std::uint64_t pages_of_block(const Span* s, std::uint64_t j) {
  const std::uint64_t from = j * s->block_size;
  const std::uint64_t last = from + s->block_size - 1;
  const auto first = static_cast<unsigned>(from / kOsPageSize);
  return run_mask(first, static_cast<unsigned>(last / kOsPageSize) + 1 - first);
}

// The blocks of s that touch its OS pages [first, first + pages), wholly carved: [from, to].
struct BlockRange {
  std::uint64_t from, to;
};
BlockRange blocks_touching(const Span* s, std::uint64_t first, std::uint64_t pages) {
  const BlockRange r{first * kOsPageSize / s->block_size, ((first + pages) * kOsPageSize - 1) / s->block_size};
  BRISK_ASSERT(r.to < s->carved_blocks);  // holes and candidates lie wholly in the carved part
  return r;
}

// The index of the block at a, a block start of s (is_carved_block: the same product).
std::uint64_t block_index(const Span* s, std::uintptr_t a) {
  return std::rotr((a - reinterpret_cast<std::uintptr_t>(s->start)) * s->inverse, s->shift);
}

// One bit per block of a span: 2 KiB on the stack at most (16-byte blocks in 256 KiB), of
// which only the words for its n blocks are cleared.
struct BlockBits {
  std::uint64_t words[kMaxSpanBlocks / 64];
  explicit BlockBits(std::uint64_t n) {
    for (std::uint64_t w = 0; w < (n + 63) / 64; ++w) words[w] = 0;
  }
  bool test(std::uint64_t j) const { return (words[j / 64] >> (j % 64) & 1) != 0; }
  void set(std::uint64_t j) { words[j / 64] |= std::uint64_t{1} << (j % 64); }
  bool all(std::uint64_t from, std::uint64_t to) const {  // [from, to], a word at a time
    for (std::uint64_t w = from / 64; w <= to / 64; ++w) {
      const unsigned lo = w == from / 64 ? static_cast<unsigned>(from % 64) : 0;
      const unsigned hi = w == to / 64 ? static_cast<unsigned>(to % 64) : 63;
      const std::uint64_t want = run_mask(lo, hi - lo + 1);
      if ((words[w] & want) != want) return false;
    }
    return true;
  }
};

Block* next_of(const Block* b) { return reinterpret_cast<Block*>(decoded_link(b)); }

}  // namespace

std::size_t span_punch_holes(Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kSmall && s->used > 0);
  // Candidates: the OS pages wholly inside the carved part (carving may still cut blocks in
  // the page where it stopped), not holes already.
  const unsigned whole_pages = static_cast<unsigned>(s->carved_bytes() / kOsPageSize);
  const std::uint64_t candidates = run_mask(0, whole_pages) & ~s->hole_pages;
  if (candidates == 0 || s->free == nullptr) return 0;
  const std::uint64_t n = s->carved_blocks;
  const std::uint64_t bs = s->block_size;

  // Not enough free room for one page: nothing to walk. (carved - used counts the free blocks
  // queued to other heaps too, so it bounds the listed ones from above.)
  if ((n - std::min<std::uint64_t>(n, s->used)) * bs < kOsPageSize) return 0;

  // Which blocks are free: those on the list, checked as alloc_small would trust them (a
  // carved block of this span, each seen once), and those touching a hole made earlier.
  BlockBits free_blocks(n);
  for (Block* b = s->free; b != nullptr; b = next_of(b)) {
    auto a = reinterpret_cast<std::uintptr_t>(b);
    if (!s->is_carved_block(a - reinterpret_cast<std::uintptr_t>(s->start)))
      fatal_pointer_error("damaged free list: brisk_trim found the link", b, "not a free block of its span");
    const std::uint64_t j = block_index(s, a);
    if (free_blocks.test(j)) fatal_pointer_error("damaged free list: brisk_trim found", b, "twice on its span's list");
    free_blocks.set(j);
  }
  for_each_bit_run(s->hole_pages, [&](unsigned first, unsigned pages) {
    const BlockRange r = blocks_touching(s, first, pages);
    for (std::uint64_t j = r.from; j <= r.to; ++j) free_blocks.set(j);
  });

  std::uint64_t holes = 0;
  for (std::uint64_t m = candidates; m != 0; m &= m - 1) {
    const auto page = static_cast<unsigned>(std::countr_zero(m));
    const BlockRange r = blocks_touching(s, page, 1);
    if (free_blocks.all(r.from, r.to)) holes |= std::uint64_t{1} << page;
  }
  if (holes == 0) return 0;

  // The list without the blocks touching a hole, in its order. Only blocks away from every hole
  // are written.
  const std::uint64_t all_holes = s->hole_pages | holes;
  Block* head = nullptr;
  Block* tail = nullptr;
  for (Block* b = s->free; b != nullptr;) {
    Block* next = next_of(b);
    if ((pages_of_block(s, block_index(s, reinterpret_cast<std::uintptr_t>(b))) & all_holes) == 0) {
      if (tail != nullptr) set_link(tail, b); else head = b;
      tail = b;
    }
    b = next;
  }
  if (tail != nullptr) set_link(tail, nullptr);
  store_shared(s->free, head);

  // Each run of hole pages in one range, all in one system call where the kernel batches them.
  platform::PageRange ranges[kMaxSpanOsPages / 2];
  std::size_t count = 0;
  for_each_bit_run(holes, [&](unsigned first, unsigned pages) {
    ranges[count++] = platform::PageRange{s->start + std::size_t{first} * kOsPageSize, std::size_t{pages} * kOsPageSize};
  });
  platform::decommit_all(ranges, count);
  store_shared(s->hole_pages, all_holes);
  return std::size_t{count_bits(holes)} * kOsPageSize;
}

void span_fill_holes(Span* s) {
  const std::uint64_t holes = s->hole_pages;
  BRISK_ASSERT(s->kind == SpanKind::kSmall && holes != 0);
  const std::uint64_t bs = s->block_size;
  // A block's first 16 bytes lie in one OS page. In a hole its key word reads zero unless a free
  // of the block exchanged its key in since the page went back (free_release_slow: it found no
  // key to match, so it took the free for a first one) or the program wrote there after the
  // free. The key goes in with an exchange too: of that free and this fill, whichever comes
  // second sees the other's key, so a second free racing with the fill is reported by one of
  // them, never sent on to the span's next owner as a block to push (twice on its list). The
  // exchange is the page's first write, one fault, as a plain store would be; reading the word
  // first would map the zero page and fault again to copy it.
  // In address order, appended behind one another, the old list after them. Blocks of more
  // than a page can touch two runs of holes: each is taken once (next).
  Block* head = nullptr;
  Block* tail = nullptr;
  std::uint64_t next = 0;
  for_each_bit_run(holes, [&](unsigned first, unsigned pages) {
    const BlockRange r = blocks_touching(s, first, pages);
    for (std::uint64_t j = std::max(next, r.from); j <= r.to; ++j) {
      char* p = s->start + j * bs;
      auto* b = reinterpret_cast<Block*>(p);
      const FreeCode code = free_code(reinterpret_cast<std::uintptr_t>(p));
      if ((holes >> (j * bs / kOsPageSize) & 1) == 0) {
        b->key = code.key;  // its key word lies outside the holes: kept, a free compares it
      } else if (std::atomic_ref<std::uintptr_t>(b->key).exchange(code.key, std::memory_order_relaxed) != 0) {
        fatal_pointer_error("double free of", b, "freed again after brisk_trim gave its page back, or written after its free");
      }
      if (tail != nullptr) set_link(tail, b); else head = b;
      tail = b;
    }
    next = r.to + 1;
  });
  set_link(tail, s->free);
  store_shared(s->free, head);
  store_shared(s->hole_pages, std::uint64_t{0});
}

bool span_block_in_hole(const Span* s, std::uintptr_t a) {
  return s->hole_pages != 0 && (pages_of_block(s, block_index(s, a)) & s->hole_pages) != 0;
}

std::size_t span_drop_tail(Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kSmall);
  const auto start = reinterpret_cast<std::uintptr_t>(s->start);
  const std::uintptr_t from = round_to_os_page(start + s->carved_bytes());
  const std::uintptr_t end = start + (std::size_t{s->page_count} << kPageShift);
  if (from >= end || !chunk_os_pages_written(chunk_of(start), from, end)) return 0;
  platform::decommit(reinterpret_cast<void*>(from), end - from);
  span_forget_tail(s, from);
  return end - from;
}

void span_forget_tail(Span* s, std::uintptr_t from) {
  const auto start = reinterpret_cast<std::uintptr_t>(s->start);
  chunk_forget_os_pages(chunk_of(start), from, start + (std::size_t{s->page_count} << kPageShift));
  // The 64 KiB pages past the one `from` is in hold nothing now (carve populates them).
  const unsigned page = static_cast<unsigned>((from - start) >> kPageShift);
  store_shared(s->resident_pages, static_cast<std::uint8_t>(s->resident_pages & ((2u << page) - 1)));
}

}  // namespace brisk
