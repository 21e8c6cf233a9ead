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
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/config.h"
#include "core/hints.h"
#include "core/span.h"

namespace brisk {

enum RegionKind : std::uint8_t {
  kRegionNone = 0,
  kRegionChunk = 1,
  kRegionLarge = 2,         // a large block whose user pointer lies 4 KiB or more into the region
  kRegionLargeAtStart = 3,  // a large block whose user pointer is the region's start (huge alignment)
};

// Indexed by address >> kChunkShift. Zero-filled .bss: untouched entries cost nothing.
extern std::uint8_t g_region_map[kRegionMapEntries];

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

struct Chunk {
  std::uint64_t magic;
  std::atomic<std::uint64_t> free_pages;   // bit i set: page i is free
  std::atomic<std::uint64_t> dirty_pages;  // bit i set: page i is free and may be resident
  std::atomic<Heap*> page_owner;           // the heap that claims pages here; null if abandoned
  Chunk* next;                              // in the page owner's list, or a global list
  Chunk* prev;
  bool abandoned;                           // on the abandoned list (under its lock)
  std::uint64_t aged;                       // free dirty pages at the page owner's last purge check
  Chunk* reg_next;                          // the registry of live chunks (chunk.cc)
  Chunk* reg_prev;
  Span* page_span[kPagesPerChunk];         // page -> its span; &spans[0] (never used): no span
  Span spans[kPagesPerChunk];              // descriptor of the span starting at page i; [0] unused

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

// Claims n consecutive free pages (page_owner only). Returns the first page index, or 0.
// Prefers pages still resident from an earlier use; *zeroed, if given, tells whether all n
// read as zeros (never used since the chunk was mapped, or purged).
unsigned chunk_claim_pages(Chunk* c, unsigned n, bool* zeroed = nullptr);
// True if the chunk has a free run of n pages that are still resident.
bool chunk_has_resident_run(Chunk* c, unsigned n);
// Claims exactly pages [first, first+n) if all are free: in-place growth of a live block, by
// any thread (the block keeps the chunk from being freed meanwhile).
bool chunk_claim_pages_at(Chunk* c, unsigned first, unsigned n);
// Returns pages to the chunk. True if the chunk has become entirely free.
bool chunk_release_pages(Chunk* c, unsigned first, unsigned n);
// Gives the resident memory of free pages back to the OS. Returns bytes.
std::size_t chunk_purge(Chunk* c, std::uint64_t only = ~std::uint64_t{0});

// A new chunk, owned by `owner`, from the chunk cache or the OS. nullptr when out of memory.
Chunk* chunk_create(Heap* owner);
// An empty chunk goes back to the cache (decommitted) or to the OS. False (and nothing done) if
// another heap claimed pages in it meanwhile.
bool chunk_destroy(Chunk* c);
// Claims n pages in a live chunk whose page owner is not h, resident pages first: a heap whose
// own chunks are full uses the free pages of others' before mapping a new chunk.
// resident_only: only runs of pages still resident.
Chunk* chunk_claim_shared(Heap* h, unsigned n, bool resident_only, unsigned* first, bool* zeroed);

// Chunks whose page owner exited. Another heap adopts one before mapping a new chunk.
void chunk_abandon(Chunk* c);
Chunk* chunk_adopt(Heap* new_owner);
// Frees an abandoned chunk that has become empty (called by whoever released its last pages).
void chunk_release_if_abandoned_and_empty(Chunk* c);

// Fork support: the chunk lists' locks.
void chunk_locks_acquire();
void chunk_locks_release();
void chunk_locks_reset_in_child();

}  // namespace brisk
