// Chunks: 4 MiB, 4 MiB-aligned pieces of address space holding small and medium blocks.
//
//   page 0      : the Chunk header below (page map, span descriptors)
//   pages 1..63 : spans, each a run of pages
//
// The region map (one byte per 4 MiB of address space) says which regions are brisk chunks or
// large blocks, so free() validates any pointer, even a stack address, with one load, and then
// finds the chunk by masking: no lock, no hash map.
//
// Page ownership: a chunk's page_owner heap searches it first for new spans and manages its
// purging; other heaps claim its free pages only when their own chunks are full
// (chunk_claim_shared), and any thread may claim the pages right after a live medium block it
// grows in place. Releases are an atomic OR. Claims are compare-and-swaps on one word, so any
// number of claimers is safe; destroying a chunk takes all its pages with one CAS first.
//
// Page state: two bitmaps, one bit per page.
//   free_pages   set: no one owns the page. Clearing a bit with a compare-and-swap claims the
//                page (chunk_claim_pages, chunk_claim_pages_at, chunk_purge, chunk_destroy);
//                only its owner sets it again (chunk_release_pages, chunk_purge).
//   dirty_pages  set: the page was used since it was last zero (mapped, purged or cached) and
//                may hold old data. Only the page's owner changes its bit:
//     release:  set dirty, then set free (release order): a page is never free without its bit;
//     claim:    compare-and-swap free, then clear dirty with fetch_and; the bits it cleared are
//               the page's state since its last release or purge, and say whether it reads as
//               zeros (alloc_medium skips calloc's memset on that alone);
//     purge:    claim the pages, clear dirty (decommitting those whose bit it cleared), set free;
//               or, lazily (BRISK_PURGE_ADVICE=1), give them to the kernel with MADV_FREE and
//               leave dirty set (they may still read as old data), marking them in lazy_pages.
//   lazy_pages   set: a free page given back lazily since its last release; a lazy purge skips
//                it (it is given back already). Changed, like dirty, only by the page's owner:
//                set by a lazy purge, cleared by every claim and by an eager purge.
//   os_pages[i]  (one 16-bit word per page, bit j for its 4 KiB OS page j) of a dirty page: the
//                OS pages that held data, so a claim can tell a page whose every OS page is
//                resident from one where a span touched only the first. A span touches its
//                pages from their start (lazy carving, carve.cc), so a page released by a
//                span that carved 8 KiB of it is mostly unfaulted: taking it for a span of 48 KiB
//                blocks faults 10 OS pages while another dirty page may be resident whole.
//                Owned like dirty: the releaser ORs in the OS pages its span wrote
//                (chunk_release_pages), a claim clears the word of each page it took clean and
//                keeps it for a dirty one (still resident), and a decommit inside a claimed page
//                clears its bits (chunk_forget_os_pages). Meaningful only while the page's
//                dirty bit is set; a hint, like the bitmaps (a lazy purge leaves it as it was).
//                Read by claims, and by the claimer's carving (carve.cc: an OS page it
//                records as unwritten is made present, by a fault or a call, as it measures
//                cheaper, before the carve writes it).
// So the dirty bit of a free page never changes, but any read of the bitmaps before a
// successful claim may be stale: between the read and the compare-and-swap, another thread can
// claim the pages, write them and release them, leaving free_pages as it was. Such reads only
// choose (which run to prefer, which pages look purgeable: chunk_has_resident_run, the purge
// check in threadcache/purge.cc); what a claimer does with the pages' contents depends only on
// the dirty bits it took after its compare-and-swap.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/config.h"
#include "core/hints.h"
#include "core/lock.h"
#include "core/platform.h"
#include "core/span.h"

namespace brisk {

enum RegionKind : std::uint8_t {
  kRegionNone = 0,
  kRegionChunk = 1,
  kRegionLarge = 2,  // this and above: a large block, its user pointer's place in the region below
};

// Indexed by address >> kChunkShift. Zero-filled .bss: untouched entries cost nothing.
extern std::uint8_t g_region_map[kRegionMapEntries];

// A large block's region holds one block start: its user pointer, at the region's start (huge
// alignments) or 4 KiB to 2 MiB (a power of two) past the 4 MiB-aligned mapping base. The region
// byte records which, so every other pointer into the region is refused without reading memory:
// the mapping may end well before the region does, and the header page below such a pointer
// may be unmapped.
inline constexpr unsigned kLargeMinOffsetShift = 12;  // kOsPageSize
constexpr std::uint8_t region_large_code(std::uintptr_t offset_in_region) {
  return offset_in_region == 0
             ? std::uint8_t{kRegionLarge}
             : static_cast<std::uint8_t>(kRegionLarge + 1 + __builtin_ctzll(offset_in_region) - kLargeMinOffsetShift);
}
constexpr std::uintptr_t region_large_offset(std::uint8_t code) {
  return code == kRegionLarge ? 0 : std::uintptr_t{1} << (code - kRegionLarge - 1 + kLargeMinOffsetShift);
}
constexpr bool region_is_large(std::uint8_t kind) { return kind >= kRegionLarge; }
static_assert(region_large_offset(region_large_code(0)) == 0 &&
              region_large_offset(region_large_code(kOsPageSize)) == kOsPageSize &&
              region_large_offset(region_large_code(kChunkSize / 2)) == kChunkSize / 2 &&
              region_large_code(kChunkSize / 2) < 0xff);

BRISK_ALWAYS_INLINE std::uint8_t region_kind(std::uintptr_t p) {
  std::uintptr_t i = p >> kChunkShift;
  // Atomic, relaxed (the same byte load on x86): an entry is rewritten when one thread unmaps
  // its region and another maps it again, ordered by the kernel and by nothing the compiler or
  // TSan can see.
  return BRISK_LIKELY(i < kRegionMapEntries) ? __atomic_load_n(&g_region_map[i], __ATOMIC_RELAXED)
                                             : std::uint8_t{kRegionNone};
}
void region_set(std::uintptr_t p, std::uint8_t kind);

inline constexpr std::uint64_t kChunkMagic = 0x6272736b63686e6bull;  // "brskchnk"
inline constexpr std::uint64_t kAllPagesFree = ~std::uint64_t{1};        // page 0 is the header

// Page bitmaps (one bit per page, as free_pages and dirty_pages): n pages from `first`.
constexpr std::uint64_t run_mask(unsigned first, unsigned n) {
  return (n >= 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << n) - 1)) << first;
}
// Set bits. Not __builtin_popcountll: without -mpopcnt it calls libgcc, and libbrisk.so needs
// libc alone.
inline unsigned count_bits(std::uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<unsigned>((x * 0x0101010101010101ull) >> 56);
}
// Calls run(first, n) for each run of set bits in mask, lowest first.
template <typename Run>
inline void for_each_bit_run(std::uint64_t mask, Run run) {
  while (mask != 0) {
    const auto first = static_cast<unsigned>(__builtin_ctzll(mask));
    const std::uint64_t from_first = mask >> first;
    const unsigned n = ~from_first == 0 ? 64 - first : static_cast<unsigned>(__builtin_ctzll(~from_first));
    run(first, n);
    mask &= ~run_mask(first, n);
  }
}

struct Chunk {
  std::uint64_t magic;
  std::atomic<std::uint64_t> free_pages;   // bit i set: page i is free
  std::atomic<std::uint64_t> dirty_pages;  // bit i set: free page i may hold old data (Page state)
  std::atomic<std::uint64_t> lazy_pages;   // bit i set: free page i was given back with MADV_FREE
  std::atomic<Heap*> page_owner;           // the heap that claims pages here; null if abandoned
  Chunk* next;                              // in the page owner's list, or a global list
  Chunk* prev;
  bool abandoned;                           // on the abandoned list (under its lock)
  // Free dirty pages at the page owner's last purge check (threadcache/purge.cc), and at the last
  // chunk_decay_all pass. Written by those checks; every claim clears its pages' bits, so a page
  // used in between is not taken for one that lay free all the time. A hint, like any read of
  // the bitmaps: a claim racing with a check's store can leave its bit set.
  std::atomic<std::uint64_t> aged;
  std::atomic<std::uint64_t> decay_aged;
  Chunk* reg_next;                          // the registry of live chunks (chunk.cc)
  Chunk* reg_prev;
  Span* page_span[kPagesPerChunk];         // page -> its span; &spans[0] (never used): no span
  Span spans[kPagesPerChunk];              // descriptor of the span starting at page i; [0] unused
  // OS pages of a dirty page that held data (Page state). After the descriptors: page_span's
  // lines are read by every free, and these are written at each span's claim and release.
  std::atomic<std::uint16_t> os_pages[kPagesPerChunk];

  char* page_address(unsigned i) { return reinterpret_cast<char*>(this) + (std::size_t{i} << kPageShift); }
  BRISK_ALWAYS_INLINE Span* span_of(std::uintptr_t p) {
    // A pointer per page rather than an index: one load on the free path (the disassembly of
    // brisk_free lost a multiply by the descriptor size).
    return page_span[(p >> kPageShift) & (kPagesPerChunk - 1)];
  }
};
static_assert(sizeof(Chunk) <= kPageSize, "the chunk header fits in page 0");

BRISK_ALWAYS_INLINE Chunk* chunk_of(std::uintptr_t p) {
  return reinterpret_cast<Chunk*>(p & ~kChunkMask);
}

// A list of chunks through next/prev: a heap's own chunks, the abandoned list, the cache.
void chunk_list_push(Chunk*& head, Chunk* c);
void chunk_list_remove(Chunk*& head, Chunk* c);

// Claims n consecutive free pages (the page owner, or another heap through chunk_claim_shared).
// Returns the first page index, or 0.
// Prefers the run with the most pages still resident from an earlier use. *dirty, if given: the
// claimed pages that may hold old data (bit i for page first + i), from the dirty bits the claim
// itself cleared; 0: all n read as zeros (never used since the chunk was mapped, or purged).
// need (one page only, n == 1): how many of the page's first OS pages the caller will touch
// soon; of the dirty free pages whose first `need` OS pages all held data, the one with the
// fewest others that did (leaving pages resident whole to spans that need them whole), else
// the one with the most of its first `need`. 0: any dirty page.
unsigned chunk_claim_pages(Chunk* c, unsigned n, std::uint64_t* dirty = nullptr, unsigned need = 0);
// True if the chunk has a free run of n pages that are still resident, or, for runs of 4 pages
// or more, at least half resident; with need (n == 1), a dirty free page whose first `need` OS
// pages held data.
bool chunk_has_resident_run(Chunk* c, unsigned n, unsigned need = 0);
// Claims exactly pages [first, first+n) if all are free: in-place growth of a live block, by
// any thread (the block keeps the chunk from being freed meanwhile).
bool chunk_claim_pages_at(Chunk* c, unsigned first, unsigned n);
// Test hook, null in production: chunk_claim_pages calls it with the run it chose after reading
// the bitmaps and before its compare-and-swap, so a test can run another claim at that point.
extern std::atomic<void (*)(Chunk* c, unsigned first, unsigned n)> g_chunk_claim_test_hook;
// Returns pages to the chunk. True if the chunk has become entirely free. written: the OS pages
// of the run that may have held data since it was claimed, bit i for its i-th (the pages'
// os_pages words take them; a run of more than 4 pages counts as all written).
inline constexpr std::uint64_t kAllWritten = ~std::uint64_t{0};
bool chunk_release_pages(Chunk* c, unsigned first, unsigned n, std::uint64_t written = kAllWritten);
// Pages [first, first+n), claimed by the caller, held data in the OS pages in `written` (as
// chunk_release_pages takes it): their os_pages words take them. For pages that go from one
// span to another without a release (span_pages.cc's take_stale_kept_page).
void chunk_note_written(Chunk* c, unsigned first, unsigned n, std::uint64_t written);
// OS pages in [from, to), inside pages the caller has claimed, were decommitted: their os_pages
// bits are cleared.
void chunk_forget_os_pages(Chunk* c, std::uintptr_t from, std::uintptr_t to);
// Whether any OS page in [from, to), inside pages the caller has claimed, is recorded as having
// held data (os_pages).
bool chunk_os_pages_written(const Chunk* c, std::uintptr_t from, std::uintptr_t to);
// Gives the resident memory of free pages back to the OS, for one chunk or for several in one
// system call where the kernel batches the ranges (platform::decommit_all: on the AMD EPYC VM
// a madvise that drops resident pages costs about 90 us while another thread of the process
// runs, most of it the other CPU's TLB flush, and one call for 16 ranges about what two cost).
// add() claims the free dirty pages of c in `only` (as chunk_destroy claims, so no one takes
// them meanwhile) and keeps them until the batch goes out: when the next chunk's ranges or
// claim would not fit, at flush(), or at destruction. Then they are handed back, clean. So a
// chunk added must stay mapped until then (the callers hold the registry lock, or own the
// chunks). lazy: with MADV_FREE (pages already given back so are skipped); else with
// MADV_DONTNEED, lazy pages included.
class ChunkPurgeBatch {
 public:
  explicit ChunkPurgeBatch(bool lazy = false) : lazy_(lazy) {}
  ~ChunkPurgeBatch() { flush(); }
  ChunkPurgeBatch(const ChunkPurgeBatch&) = delete;
  ChunkPurgeBatch& operator=(const ChunkPurgeBatch&) = delete;
  // Returns the bytes of the pages to be given back (0: none claimed).
  std::size_t add(Chunk* c, std::uint64_t only = ~std::uint64_t{0});
  void flush();

 private:
  struct Claim {
    Chunk* chunk;
    std::uint64_t claimed;  // taken from free_pages, handed back after the call
    std::uint64_t advised;  // the pages the call gives back (lazily: to mark lazy)
  };
  // Sized for the stack of a free() (about 900 bytes): a chunk's free pages form at most 32
  // runs, so one chunk always fits.
  static constexpr std::size_t kRanges = kPagesPerChunk / 2;
  static constexpr std::size_t kClaims = 16;
  static_assert(kRanges <= platform::kMaxDecommitRanges);
  bool lazy_;
  std::size_t ranges_ = 0;
  std::size_t claims_ = 0;
  platform::PageRange range_[kRanges];
  Claim claim_[kClaims];
};
// One chunk's ChunkPurgeBatch. Returns bytes.
std::size_t chunk_purge(Chunk* c, std::uint64_t only = ~std::uint64_t{0}, bool lazy = false);
// chunk_purge of every live chunk, whoever owns its pages: abandoned chunks, other heaps'. Sound
// while their owners run, because chunk_purge claims what it decommits (see "Page state"); the
// registry lock keeps each chunk mapped meanwhile. Returns bytes (brisk_trim).
std::size_t chunk_purge_all();
// The background thread's decay purge of every live chunk: purges the pages that were free and
// dirty at the previous pass and still are (so a page is purged between one and two pass
// intervals after it was freed, and a page reused in between is spared). Sound like
// chunk_purge_all. Returns bytes purged; *pending: free dirty pages remain for the next pass.
// Only chunks whose page owner (nullptr: abandoned) passes `decays`.
std::size_t chunk_decay_all(bool* pending, bool lazy, bool (*decays)(const Heap* page_owner));
// Unmaps every chunk in the chunk cache. Returns bytes of address space unmapped.
std::size_t chunk_cache_flush();
// Calls visit(c, context) for every live chunk (not the cached ones), under the registry lock,
// which keeps each mapped meanwhile: visit must take no lock, and read what the pages' owners
// change only through atomics (the bitmaps, and span fields through load_shared). Statistics.
void chunk_for_each_live(void (*visit)(Chunk* c, void* context), void* context);

// A new chunk, owned by `owner`, from the chunk cache or the OS. nullptr when out of memory.
Chunk* chunk_create(Heap* owner);
// An empty chunk goes back to the cache (decommitted) or to the OS. False (and nothing done) if
// another heap claimed pages in it meanwhile.
bool chunk_destroy(Chunk* c);
// Claims n pages in a live chunk whose page owner is not h, resident pages first: a heap whose
// own chunks are full uses the free pages of others' before mapping a new chunk.
// resident_only: runs of pages still resident first (chunk_has_resident_run), then, if no
// scanned chunk has one, any free run; otherwise any free run at once. need (n == 1): only a
// chunk with a page that fits it (chunk_claim_pages), nothing else (the claim itself takes
// another page if that one went meanwhile).
Chunk* chunk_claim_shared(Heap* h, unsigned n, bool resident_only, unsigned* first, std::uint64_t* dirty,
                          unsigned need = 0);

// Chunks whose page owner exited. Another heap adopts one before mapping a new chunk.
void chunk_abandon(Chunk* c);
Chunk* chunk_adopt(Heap* new_owner);
// chunk_release_pages for a span's pages; an abandoned chunk that this release empties goes to
// the chunk cache or the OS.
void chunk_release_span_pages(Chunk* c, unsigned first, unsigned n, std::uint64_t written = kAllWritten);
// Frees every abandoned chunk that is empty (brisk_trim, after chunk_purge_all).
void chunk_destroy_empty_abandoned();

// Fork support: the chunk lists' locks.
void chunk_locks_acquire();
void chunk_locks_release();
void chunk_locks_reset_in_child();
// The counts of the registry, empty-chunk cache and abandoned-list locks (brisk_get_lock_stats).
LockCounts chunk_registry_lock_counts();
LockCounts chunk_cache_lock_counts();
LockCounts chunk_abandoned_lock_counts();

}  // namespace brisk
