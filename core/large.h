// Large blocks (> kMediumMax, or alignment beyond what spans serve): mapped from the OS, page
// aligned, one mapping per block, reused through a bounded cache of recently freed mappings
// (large.cc: its budgets, its decay, and how a larger mapping is split for reuse).
//
// Layout: [base ... header page | user block ...]. The header sits in the 4 KiB page just below
// the user pointer p, and the region map marks p's 4 MiB region, which this mapping owns
// exclusively (the mapping base is 4 MiB aligned, or the region starts at p for alignments of
// 4 MiB and more), with p's place in it (region_large_code in chunk.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/lock.h"

namespace brisk {

struct LargeHeader {
  std::uint64_t check;      // kLargeMagic ^ user address: proves p is a live large block
  char* base;               // the mapping
  std::size_t map_size;
  std::size_t alignment;    // the mapping's alignment (kChunkSize, or more for huge alignment)
  const void* owner;        // the caller's tag at allocation (the thread heap), for large_free_to
};

// nullptr (and no errno change) on failure; the caller sets errno. zero: contents must read 0.
// owner: kept in the header for large_free_to. grows: a block realloc is moving to grow, which
// keeps the cached space after it resident to grow into (see large_alloc in large.cc).
void* large_alloc(std::size_t size, std::size_t alignment, bool zero, const void* owner = nullptr, bool grows = false);
// The header of p, or nullptr if p is not the start of a live large block. kind is
// region_kind(p), already known to be a large block's (region_is_large). Reads no memory but
// that header, and only for the pointer the region byte names.
LargeHeader* large_header_of(const void* p, std::uint8_t kind);
void large_free(void* p, LargeHeader* h);
std::size_t large_usable_size(const void* p, const LargeHeader* h);

// A freed mapping that a thread keeps for its own next large block, outside the cache and its
// lock (the large stash, threadcache/medium.cc). The statistics count it as cached and
// resident.
struct LargeMapping {
  char* base = nullptr;
  std::size_t size = 0;
};
// Frees p as large_free does, but hands its mapping to the caller when it has the default
// alignment, holds at most max_user bytes past its header page and was allocated with this
// owner: true and *out. False: p is untouched (free it with large_free).
bool large_free_to(void* p, LargeHeader* h, std::size_t max_user, const void* owner, LargeMapping* out);
// A block of size bytes (default alignment) at the front of m, a mapping from large_free_to,
// if it fits and uses at least half of it; nullptr, and m stays the caller's, otherwise. zero:
// reads as zeros.
void* large_alloc_from(LargeMapping m, std::size_t size, bool zero, const void* owner);
// Gives m, from large_free_to, to the cache as large_free would have.
void large_give(LargeMapping m);

// Resizes in place (mremap) or moves the pages without copying. nullptr if it cannot; p intact.
void* large_realloc(void* p, LargeHeader* h, std::size_t new_size);
// large_realloc's in-place part: p's mapping holds new_size bytes from p afterwards (grown into
// the cached space after it or by mremap; shrunk when that frees half of it). False: it cannot
// grow where it is, and p is untouched.
bool large_resize_in_place(void* p, LargeHeader* h, std::size_t new_size);

// Test hook, null in production: large_realloc calls it with the old user pointer once it has
// moved a block's pages away, so a test can stand in for another thread mapping a block there.
extern std::atomic<void (*)(void* old_p)> g_large_moved_test_hook;

// Decommits the cached mappings that have stayed dirty for BRISK_LARGE_DECAY_MS or longer at
// now_ms (platform::now_ms()). Returns bytes decommitted; *pending (if given) is set when dirty
// mappings remain to age. Run by the background thread each pass, and by large_free and
// large_alloc's mapping path when the oldest dirty mapping is due.
std::size_t large_cache_decay(std::uint64_t now_ms, bool* pending = nullptr);
// Returns every cached mapping to the OS. Returns bytes unmapped.
std::size_t large_cache_flush();
// platform::map_aligned, and where the OS refuses (ENOMEM: RLIMIT_AS, the commit limit of
// vm.overcommit_memory=2, vm.max_map_count), once more after giving back the address space the
// core's caches hold: every cached large mapping and every cached empty chunk. Without that a
// program under such a limit got ENOMEM (and operator new's handler loop bad_alloc, its reserve
// freed) while brisk held hundreds of MiB of freed mappings. For chunk_create and large blocks;
// the caller holds neither cache's lock.
void* map_aligned_or_flush_caches(std::size_t size, std::size_t alignment);
// For the statistics: the resident bytes of the cached mappings now (mincore over each dirty
// entry's dirty range; a clean entry reads as zeros, and an entry's first page, outside its
// range, is not counted), plus the threads' stashed mappings by size.
std::size_t large_cache_resident_bytes();
// Tests: a copy of the cache as it is now, so that a test can check the invariants large.cc
// keeps (tests/large_test.cc, RandomTrafficKeepsEveryEntrySound). The caller holds the cache's lock
// (large_locks_acquire), and may read the entries' pages before it lets go: no entry is unmapped
// or decommitted meanwhile. Fills out[0 .. min(max, entries)) in the cache's order.
struct LargeCacheEntryView {
  char* base;
  std::size_t size;
  std::size_t dirty;        // bytes past the first page that may hold data (0: reads as zeros)
  std::size_t dirty_begin;  // where they can lie, as offsets from base (empty when clean)
  std::size_t dirty_end;
  std::uint64_t freed_ms;
  bool fit_matches;  // the scan's summary word (g_fit) agrees with the entry
};
struct LargeCacheView {
  std::size_t entries;
  std::size_t bytes;        // the cache's count of its entries' sizes
  std::size_t dirty_bytes;  // and of their dirty bytes
  std::uint64_t oldest_dirty_ms;  // the lower bound large_free reads (~0: no entry is dirty)
};
LargeCacheView large_cache_view_for_test(LargeCacheEntryView* out, std::size_t max);
void large_locks_acquire();
void large_locks_release();
void large_locks_reset_in_child();
LockCounts large_lock_counts();  // the cache's lock (brisk_get_lock_stats)

}  // namespace brisk
