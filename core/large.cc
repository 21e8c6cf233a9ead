#include "core/large.h"

#include <atomic>

#include "core/assert.h"
#include "core/chunk.h"
#include "core/config.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"

namespace brisk {
namespace {

constexpr std::uint64_t kLargeMagic = 0x6272736b6c617267ull;  // "brsklarg"
// Enough entries that MMtest's large test on 10 threads (10 blocks each) finds every freed
// mapping in the cache; a full cache unmaps its oldest entry.
constexpr unsigned kCacheEntries = 256;
constexpr std::uint64_t kNoDirtyEntry = ~std::uint64_t{0};

// A run of freed address space: one freed mapping, or several that lay side by side, merged, or
// what a carved block left of one. Its first page is outside `dirty` and never decommitted: a
// block is carved at a region boundary at or past it, and every block's user bytes start a page
// or more past that (placement), so only a header or a piece's lead-in lies there, or the user
// bytes of a block that grew into the entry (cache_take_adjacent), which realloc does not
// promise to be zeros. So no one trusts an entry's first page to read as zeros.
struct CacheEntry {
  char* base;
  std::size_t size;
  std::size_t dirty;       // bytes past the first page that may be resident or hold old
                           // contents: an upper bound, counted without a system call; 0: they
                           // read as zeros ("clean")
  std::uint64_t freed_ms;  // platform::now_ms() when its oldest dirty bytes were freed
  // Where those bytes can be, as offsets from base: [dirty_begin, dirty_end) (empty, both at the
  // first page, when clean). Past the first page and outside it, the entry reads as zeros
  // (untouched since it was mapped or decommitted). A freed block dirties its whole mapping
  // while the rest of the region it was carved from stays untouched: so a block carved again
  // from the merged entry (a growing buffer: MMtest's strings, realloc) leaves a rest known
  // clean, which needs no mincore (return_rest_of_region) and stays cached clean.
  std::size_t dirty_begin;
  std::size_t dirty_end;
};

// An entry's dirty range when it is clean.
constexpr std::size_t kNoDirtyRange = kOsPageSize;

// The cache of freed mappings, with two budgets:
//   - address space (BRISK_LARGE_CACHE_BYTES): what reuse saves is mmap, the aligned-mapping
//     trim and munmap, and address space costs no memory;
//   - dirty bytes (BRISK_LARGE_DIRTY_BYTES): freed mappings are kept as they were, with whatever
//     pages the program touched, so that reuse also skips the page faults. A freed mapping counts
//     its whole size: measuring its resident pages with mincore on every free made the seed's
//     large test, whose blocks are never touched, 7x slower than tcmalloc. Past the budget the
//     oldest dirty entries are decommitted (MADV_DONTNEED) and stay cached clean.
// Time returns the rest: large_cache_decay decommits entries that have stayed dirty for
// BRISK_LARGE_DECAY_MS. Decommit and unmap run outside the lock, on entries taken out of the
// cache meanwhile, so no other thread can hand one out half-decommitted.
// Neighbouring entries merge, and a block is carved exactly out of the smallest entry that fits
// it from a region boundary on: measured on a replacement loop like brisk-stress large-replace
// (256 KiB-64 MiB blocks, 1 in 4 touched, 1 thread, 400 replacements), keeping each mapping
// apart made the cache fragment into pieces too small for the big requests, which then mapped
// fresh memory: 906 MiB mapped and 126k page faults; merged, 445 MiB and 83k; carved exactly
// from 64 MiB fresh mappings (kMinGrow), 320 MiB and 77k (tcmalloc: 70k). A block carved across
// two kernel mappings (a merge can join mappings the kernel keeps apart) is still sound: mremap
// refuses it, and realloc falls back to a copy.
// jemalloc's retained and dirty extents, with its decay, follow the same idea.
SpinLock g_lock;
CacheEntry g_cache[kCacheEntries];
// g_fit[i], kept with g_cache[i]: the bytes from entry i's first region boundary to its end (0
// if it has none), a multiple of the page size, with bit 0 set when the entry is dirty. It is all
// cache_take's scan reads, one dense word an entry, where reading the 32-byte entries and rounding
// each base made the scan the longest hold of g_lock: on MMtest's large test as written on 10
// threads (brisk-stress large-raw --rows parallel, a take and a put per block, 60 entries
// scanned on average) 1.58M of 2.0M acquisitions met the lock held, 0.97M with this array.
std::uint64_t g_fit[kCacheEntries];
unsigned g_cache_used = 0;
std::atomic<unsigned> g_cache_entries{0};  // g_cache_used, readable without the lock
std::size_t g_cache_bytes = 0;
std::size_t g_dirty_bytes = 0;
// At most the oldest freed_ms of a dirty entry (kNoDirtyEntry: none is dirty): lets large_free
// and large_alloc see whether a decay may be due with one load and a clock read, without the
// lock. Lowered by every insertion; made exact again only by large_cache_decay, so that taking
// an entry out costs no scan.
std::atomic<std::uint64_t> g_oldest_dirty_ms{kNoDirtyEntry};

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) & ~(a - 1); }

// Offset of the user pointer from the mapping base, and the mapping's alignment.
void placement(std::size_t alignment, std::size_t* offset, std::size_t* map_align) {
  if (alignment < kChunkSize) {
    *offset = alignment < kOsPageSize ? kOsPageSize : alignment;
    *map_align = kChunkSize;
  } else {
    *offset = alignment;
    *map_align = alignment;
  }
}

std::size_t option_bytes(options::Id id) { return static_cast<std::size_t>(options::get(id)); }

std::uint64_t fit_key(const CacheEntry& e) {
  auto base = reinterpret_cast<std::uintptr_t>(e.base);
  std::uintptr_t start = round_up(base, kChunkSize), end = base + e.size;
  std::uint64_t fit = start < end ? end - start : 0;
  BRISK_ASSERT((fit & 1) == 0);
  return fit | (e.dirty != 0 ? 1u : 0u);
}

// Under g_lock: entry `to` becomes the last one, which leaves the array.
void move_last_to(unsigned to) {
  --g_cache_used;
  g_cache[to] = g_cache[g_cache_used];
  g_fit[to] = g_fit[g_cache_used];
}

// Under g_lock.
void refresh_oldest_dirty() {
  std::uint64_t oldest = kNoDirtyEntry;
  for (unsigned i = 0; i < g_cache_used; ++i)
    if (g_cache[i].dirty != 0 && g_cache[i].freed_ms < oldest) oldest = g_cache[i].freed_ms;
  g_oldest_dirty_ms.store(oldest, std::memory_order_relaxed);
}

// Under g_lock: takes entry i out of the cache and returns it.
CacheEntry remove_entry(unsigned i) {
  CacheEntry e = g_cache[i];
  g_cache_bytes -= e.size;
  g_dirty_bytes -= e.dirty;
  stats::add(&stats::Stripe::large_bytes_cached, -static_cast<std::int64_t>(e.size));
  move_last_to(i);
  g_cache_entries.store(g_cache_used, std::memory_order_relaxed);
  return e;
}

// Under g_lock: puts e, counted already, in a free slot.
void append_entry(const CacheEntry& e) {
  g_fit[g_cache_used] = fit_key(e);
  g_cache[g_cache_used++] = e;
  g_cache_entries.store(g_cache_used, std::memory_order_relaxed);
  if (e.dirty != 0 && e.freed_ms < g_oldest_dirty_ms.load(std::memory_order_relaxed))
    g_oldest_dirty_ms.store(e.freed_ms, std::memory_order_relaxed);
}

// Under g_lock: whether e fits in both budgets now, with the first pages of up to two
// neighbours it may merge with counted dirty.
bool room_for(const CacheEntry& e) {
  return g_cache_used < kCacheEntries && g_cache_bytes + e.size <= option_bytes(options::Id::kLargeCacheBytes) &&
         g_dirty_bytes + e.dirty + 2 * kOsPageSize <= option_bytes(options::Id::kLargeDirtyBytes);
}

// The age of two neighbouring entries merged: the mean of their ages weighted by their dirty
// bytes (the newer one's when neither is dirty). Not the older age: on a replacement loop the
// blocks are carved side by side and merge back when freed, so one entry holds the whole loop,
// and as old as its oldest bytes it was decommitted at every decay while most of its pages had
// been in use a moment before (a loop like mimalloc-bench's malloc-large, twenty 5-25 MiB
// zeroed buffers replaced 2,000 times: 298k page faults in balanced mode against 147k with no
// decay, tcmalloc 185k). Idle memory still goes back: the mean is no newer than the last free
// into the entry, so an entry nobody frees into decays at most the delay after that free.
std::uint64_t merged_age(const CacheEntry& a, const CacheEntry& b) {
  if (a.dirty == 0 && b.dirty == 0) return a.freed_ms > b.freed_ms ? a.freed_ms : b.freed_ms;
  const CacheEntry& older = a.freed_ms <= b.freed_ms ? a : b;
  const CacheEntry& newer = a.freed_ms <= b.freed_ms ? b : a;
  const double newer_share = static_cast<double>(newer.dirty) / static_cast<double>(a.dirty + b.dirty);
  return older.freed_ms + static_cast<std::uint64_t>(static_cast<double>(newer.freed_ms - older.freed_ms) * newer_share);
}

// Under g_lock, with room_for(e): puts e in the cache, merged with the entries on either side.
void insert_entry(CacheEntry e) {
  BRISK_ASSERT(g_cache_used < kCacheEntries && e.size >= kOsPageSize);
  g_cache_bytes += e.size;  // counted before the merges, which move their neighbours' bytes in
  g_dirty_bytes += e.dirty;
  stats::add(&stats::Stripe::large_bytes_cached, static_cast<std::int64_t>(e.size));
  for (unsigned i = 0; i < g_cache_used;) {
    CacheEntry& n = g_cache[i];
    if (n.base + n.size != e.base && e.base + e.size != n.base) {
      ++i;
      continue;
    }
    // The right one's first page, which may hold a header, is inside the merged entry.
    std::size_t dirty = e.dirty + n.dirty + kOsPageSize;
    const CacheEntry& left = n.base < e.base ? n : e;
    const CacheEntry& right = n.base < e.base ? e : n;
    // The right one's first page, counted dirty above, joins its range.
    const std::size_t right_begin = left.size;
    const std::size_t right_end = left.size + (right.dirty_end > kOsPageSize ? right.dirty_end : kOsPageSize);
    const bool left_dirty = left.dirty_begin < left.dirty_end;
    e = CacheEntry{left.base, n.size + e.size, dirty, merged_age(e, n),
                   left_dirty ? left.dirty_begin : right_begin, right_end};
    g_dirty_bytes += kOsPageSize;
    move_last_to(i);  // its bytes stay counted, now in e
  }
  append_entry(e);
}

// Under g_lock: the index of the entry freed longest ago (only dirty ones if dirty_only), or -1.
int oldest_entry(bool dirty_only) {
  int oldest = -1;
  for (unsigned i = 0; i < g_cache_used; ++i) {
    if (dirty_only && g_cache[i].dirty == 0) continue;
    if (oldest < 0 || g_cache[i].freed_ms < g_cache[oldest].freed_ms) oldest = static_cast<int>(i);
  }
  return oldest;
}

void unmap_mapping(char* base, std::size_t size) {
  platform::unmap(base, size);
  stats::add(&stats::Stripe::large_bytes_mapped, -static_cast<std::int64_t>(size));
}

// Drops a cached entry's pages but its first (see CacheEntry). Keeping that page keeps the page
// table of the entry's first 2 MiB too: on this project's VM, dropping the last page of a page
// table and faulting it back on reuse (the header write) cost more than the madvise itself
// (perf: native_set_pmd in zap and in the fault, 29% of MMtest's large test as written with
// every free decommitting).
void decommit_entry(CacheEntry* e) {
  platform::decommit(e->base + kOsPageSize, e->size - kOsPageSize);
  e->dirty = 0;
  e->dirty_begin = e->dirty_end = kNoDirtyRange;
}

// Puts an entry taken out of the cache back, keeping its age; unmaps it if the cache has no
// room for it any more.
void return_entry(CacheEntry e) {
  {
    LockGuard g(g_lock);
    if (room_for(e)) {
      insert_entry(e);
      return;
    }
  }
  unmap_mapping(e.base, e.size);
}

// The same, decommitted first: back clean.
void decommit_and_return(CacheEntry e) {
  decommit_entry(&e);
  return_entry(e);
}

// A piece of entry e, [from, from + size), with e's age and as many of its dirty bytes as the
// part of e's dirty range past the piece's first page can hold (they could be anywhere in that
// range). So the two pieces of a carve may count more dirty bytes than e did, by at most the
// piece before the block (under a region); the next cache_put makes room again. A piece outside
// e's dirty range but for its first page is clean.
CacheEntry piece_of(const CacheEntry& e, char* from, std::size_t size) {
  const auto offset = static_cast<std::size_t>(from - e.base);
  const std::size_t begin = e.dirty_begin > offset + kOsPageSize ? e.dirty_begin : offset + kOsPageSize;
  const std::size_t end = e.dirty_end < offset + size ? e.dirty_end : offset + size;
  if (begin >= end || e.dirty == 0) return CacheEntry{from, size, 0, e.freed_ms, kNoDirtyRange, kNoDirtyRange};
  const std::size_t dirty = end - begin < e.dirty ? end - begin : e.dirty;
  return CacheEntry{from, size, dirty, e.freed_ms, begin - offset, end - offset};
}

// A cached mapping for `need` bytes at a region boundary, nullptr if none fits. Among the
// entries that fit, a dirty one (whose pages may be there) wins over a clean one, unless the
// caller wants zeros, and then the smallest: a clean entry's pages fault in again one by one,
// while a dirty one's are resident until a decay decommits them, so taking the dirty one saves
// the faults and leaves less resident memory waiting in the cache (README "What each mode
// costs and saves" has the numbers). The block is carved out of it exactly, at its first
// region boundary; what lies before and after stays cached, so no tail is unmapped and no
// address space is rounded away (both pieces merge back when the block is freed). *size: the
// bytes handed out (more than need only when the cache has no slot left for the piece after);
// *clean: they read as zeros but for their first page.
// tail, when given and the entry is dirty: a block smaller than a region leaves out of the
// cache the rest of its region after it, in *tail (size 0 if none), for the caller to give back
// (see large_alloc); it stays out of the cache until then, so that no other thread can take or
// unmap it, nor the kernel map something else there, before the decommit.
char* cache_take(std::size_t need, bool zero, std::size_t* size, bool* clean, CacheEntry* tail = nullptr) {
  if (g_cache_entries.load(std::memory_order_relaxed) == 0) return nullptr;
  LockGuard g(g_lock);
  // The smallest fit of the wanted kind, else the smallest fit: as keys, the fit with the top
  // bit set for an entry of the other kind, the least key wins.
  const std::uint64_t flip = zero ? 0 : 1;  // bit 0 of g_fit, xor flip: 1 for the other kind
  std::uint64_t best_key = ~std::uint64_t{0};
  int best = -1;
  for (unsigned i = 0; i < g_cache_used; ++i) {
    const std::uint64_t k = g_fit[i];
    const std::uint64_t fit = k & ~std::uint64_t{1};
    if (fit < need) continue;
    const std::uint64_t key = fit | (((k & 1) ^ flip) << 63);
    if (key < best_key) {
      best_key = key;
      best = static_cast<int>(i);
    }
  }
  if (best < 0) return nullptr;
  // The pieces need no merging: e was merged with every cached neighbour when it was inserted,
  // and the block lies between them.
  CacheEntry e = remove_entry(static_cast<unsigned>(best));
  *clean = e.dirty == 0;
  char* start = reinterpret_cast<char*>(round_up(reinterpret_cast<std::uintptr_t>(e.base), kChunkSize));
  char* end = e.base + e.size;
  std::size_t taken = need;
  CacheEntry pieces[2];
  unsigned count = 0;
  if (start > e.base) pieces[count++] = piece_of(e, e.base, static_cast<std::size_t>(start - e.base));
  // Removing e freed one slot; without a second one the block takes the piece after it.
  const bool slot_after = count == 0 || g_cache_used + 1 < kCacheEntries;
  char* after = start + need;  // where the cached piece after the block starts
  if (tail != nullptr) {
    tail->size = 0;
    char* region_end = static_cast<std::size_t>(end - start) > kChunkSize ? start + kChunkSize : end;
    // A slot for each piece, the tail's included: without one for it, it would be unmapped
    // when it goes back, and the block could no longer grow into it nor merge with it.
    const unsigned slots_needed = count + (region_end < end ? 1u : 0u) + 1u;
    if (!*clean && need < kChunkSize && region_end - after > static_cast<std::ptrdiff_t>(kOsPageSize) &&
        g_cache_used + slots_needed <= kCacheEntries) {
      // A rest outside e's dirty range has nothing to give back: it stays cached with the
      // piece after.
      const CacheEntry rest = piece_of(e, after, static_cast<std::size_t>(region_end - after));
      if (rest.dirty != 0) {
        *tail = rest;
        after = region_end;
      }
    }
  }
  if (after < end) {
    if (slot_after) {
      pieces[count++] = piece_of(e, after, static_cast<std::size_t>(end - after));
    } else {
      taken = static_cast<std::size_t>(end - start);
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    g_cache_bytes += pieces[i].size;
    g_dirty_bytes += pieces[i].dirty;
    stats::add(&stats::Stripe::large_bytes_cached, static_cast<std::int64_t>(pieces[i].size));
    append_entry(pieces[i]);
  }
  *size = taken;
  return start;
}

// The first `bytes` of the cached entry that starts at `at`, taken out of the cache for a block
// that ends at `at` to grow into: true when there is such an entry of at least that size (its
// rest stays cached). The pages come as the entry holds them: resident with old contents when
// it is dirty, which realloc's new bytes may hold, and no system call. Without this a large
// block could almost never grow in place: the space after it is the cached rest of the mapping
// it was carved from, so mremap in place failed and the block moved to fresh pages (a buffer
// growing from 8 B to 4 MiB in steps of 1/16 to 1/2, 8 at a time: 508,524 page faults where
// jemalloc took 10,356).
bool cache_take_adjacent(char* at, std::size_t bytes) {
  if (g_cache_entries.load(std::memory_order_relaxed) == 0) return false;
  LockGuard g(g_lock);
  for (unsigned i = 0; i < g_cache_used; ++i) {
    if (g_cache[i].base != at) continue;
    if (g_cache[i].size < bytes) return false;
    CacheEntry e = remove_entry(i);
    if (e.size > bytes) {
      // The piece after keeps e's age and what it can hold of e's dirty bytes; its first page,
      // which a carve never hands out as user bytes, is one e counted dirty or held clean.
      CacheEntry rest = piece_of(e, at + bytes, e.size - bytes);
      g_cache_bytes += rest.size;
      g_dirty_bytes += rest.dirty;
      stats::add(&stats::Stripe::large_bytes_cached, static_cast<std::int64_t>(rest.size));
      append_entry(rest);
    }
    return true;
  }
  return false;
}

// Caches a freed mapping as it is, making room first: past the entry count or the address
// budget the oldest entries are unmapped, past the dirty budget the oldest dirty ones are
// decommitted. False if it cannot be cached at all (the caller unmaps it).
bool cache_put(char* base, std::size_t size, std::uint64_t now) {
  if (size > option_bytes(options::Id::kLargeCacheBytes)) return false;
  CacheEntry entry{base, size, size - kOsPageSize, now, kOsPageSize, size};
  if (entry.dirty + 2 * kOsPageSize > option_bytes(options::Id::kLargeDirtyBytes)) {
    // Decommit before the mapping becomes visible in the cache: another thread may take it at once.
    decommit_entry(&entry);
  }
  for (;;) {
    CacheEntry victim;
    bool unmap_victim;
    {
      LockGuard g(g_lock);
      if (room_for(entry)) {
        insert_entry(entry);
        return true;
      }
      // A strategy switch may have lowered a budget below this entry since it was checked.
      if (size > option_bytes(options::Id::kLargeCacheBytes) ||
          entry.dirty + 2 * kOsPageSize > option_bytes(options::Id::kLargeDirtyBytes))
        return false;
      unmap_victim = g_cache_used == kCacheEntries ||
                     g_cache_bytes + size > option_bytes(options::Id::kLargeCacheBytes);
      int i = oldest_entry(/*dirty_only=*/!unmap_victim);
      BRISK_ASSERT(i >= 0);  // over a budget that the entry alone fits: another entry holds the excess
      victim = remove_entry(static_cast<unsigned>(i));
    }
    if (unmap_victim) {
      unmap_mapping(victim.base, victim.size);
    } else {
      decommit_and_return(victim);
    }
  }
}

// A fresh mapping for the cache is at least this big: the block takes its front and the rest is
// cached untouched, so the blocks that follow are carved next to it and merge with each other
// when freed, where mappings of their own would lie apart (map_aligned leaves holes between
// them). On large-replace (brisk-compare, 7 pairs, speed mode), carving fresh mappings this way
// took the time ratio to tcmalloc from 1.17 [0.96, 1.25] to 0.99 [0.86, 1.06] and peak RSS from
// 1.33 to 1.25 GiB (tcmalloc 1.20). Address space only: the rest costs no memory.
constexpr std::size_t kMinGrow = 64 << 20;

// Whether the address budget has room to cache `bytes` more: a hint, read without the lock
// from the statistics counter that mirrors g_cache_bytes (a sum over the stripes, paid only
// when the cache had no room for the block and a mapping is made).
bool fresh_rest_fits(std::size_t bytes) {
  return stats::sum(&stats::Stripe::large_bytes_cached) + bytes <=
         option_bytes(options::Id::kLargeCacheBytes);
}

// The rest of a fresh mapping, untouched: cached clean, or unmapped if there is no room.
void cache_rest_of_fresh(char* base, std::size_t size, std::uint64_t now) {
  CacheEntry rest{base, size, 0, now, kNoDirtyRange, kNoDirtyRange};
  {
    LockGuard g(g_lock);
    if (room_for(rest)) {
      insert_entry(rest);
      return;
    }
  }
  unmap_mapping(base, size);
}

// Runs a decay if the oldest dirty entry has aged past the delay (one load when none is dirty).
void decay_if_due() {
  std::uint64_t oldest = g_oldest_dirty_ms.load(std::memory_order_relaxed);
  if (oldest == kNoDirtyEntry) return;
  std::uint64_t now = platform::now_ms();
  if (now >= oldest && now - oldest >= static_cast<std::uint64_t>(options::get(options::Id::kLargeDecayMs)))
    large_cache_decay(now, nullptr);
}

// The rest of a block's region (large_alloc): decommitted when at least a quarter of it is
// resident (a mincore, which sends no TLB shootdown), else put back as it is, dirty as it was
// counted (its pages may be swapped out rather than absent: only a decommit makes an entry
// clean, which calloc trusts to read as zeros); the decay takes those pages later. A madvise
// that drops resident pages shoots down the other CPUs' TLB entries, and on a VM where that is
// dear (the AMD EPYC VM, 2026-12-04) giving back every rest made brisk-stress prodcons, whose
// 1-2 MiB blocks are written in a few pages, take 1.14x the time of not doing it (9 pairs),
// for 8.6 MiB of its peak; alloc-test's rests, carved from a freed 12 MiB array written whole,
// are resident whole and still go back.
void return_rest_of_region(CacheEntry rest) {
  const std::size_t resident = platform::resident_bytes(rest.base + kOsPageSize, rest.size - kOsPageSize);
  if (resident * 4 >= rest.size) return decommit_and_return(rest);
  return_entry(rest);
}

void* finish(char* base, std::size_t map_size, std::size_t offset, std::size_t map_align, const void* owner) {
  char* p = base + offset;
  auto* h = reinterpret_cast<LargeHeader*>(p - kOsPageSize);
  h->check = kLargeMagic ^ reinterpret_cast<std::uintptr_t>(p);
  h->base = base;
  h->map_size = map_size;
  h->alignment = map_align;
  h->owner = owner;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  region_set(a, region_large_code(a & kChunkMask));
  stats::add(&stats::Stripe::large_live_blocks, 1);
  stats::add(&stats::Stripe::large_bytes_in_use, static_cast<std::int64_t>(map_size - offset));
  return p;
}

}  // namespace

void* large_alloc(std::size_t size, std::size_t alignment, bool zero, const void* owner, bool grows) {
  std::size_t offset, map_align;
  placement(alignment, &offset, &map_align);
  // A power-of-two alignment (the entry points check it) puts p where its region byte can say.
  if (size > (std::size_t{1} << 62) || offset > (std::size_t{1} << 62) || (alignment & (alignment - 1)) != 0)
    return nullptr;
  std::size_t need = round_up(offset + size, kOsPageSize);
  bool clean = false;
  std::size_t map_size = need;
  // A block carved from a dirty cached entry would leave the rest of its last 4 MiB region
  // cached after it, with whatever pages the entry had resident there. No other large block and
  // no chunk can start inside a region, so until this block grows into that rest or is freed,
  // those pages would be of use to no one: they are given back now, and the rest cached clean
  // (brisk-stress alloc-test, whose first row frees a 12 MiB array that the second row's ten
  // 1.2 MiB arrays are carved from, one per region: peak RSS 35.4 -> 27.0 MiB, time level). Not
  // for a block realloc moves to grow (it grows into that rest: the realloc row took 1.12x the
  // time), nor for blocks of a region or more, whose rest is a small part of them and which
  // MMtest's large tests replace by the thousand (a madvise each made them 1.9x and 2.6x slower).
  CacheEntry tail{};
  char* base = map_align == kChunkSize ? cache_take(need, zero, &map_size, &clean, grows ? nullptr : &tail) : nullptr;
  if (base != nullptr) {
    if (tail.size != 0) return_rest_of_region(tail);
    // A reused dirty mapping holds old contents. For calloc: its present pages are written
    // with zeros, swapped-out ones decommitted and untouched ones left alone, page run by page
    // run (platform::zero_pages).
    // Writing zeros over a resident page is far cheaper than dropping it and faulting it back
    // (measured: a 4 MiB calloc touched page by page took 12.4 ms after MADV_DONTNEED, against
    // 82 us for a memset of resident memory under mimalloc), and pages that are not resident
    // stay so. Dropping a mostly untouched mapping whole, as before, shot down the TLB entries
    // of its few resident pages on every CPU, and a program that reads its calloc'ed block
    // before writing it (brisk-stress prodcons) then faulted each such page twice: once to map
    // the zero page, once to copy it. The mincore (and, where pages are not resident, the
    // pagemap read) that tells the pages apart is paid here, by calloc, which must zero or drop
    // anyway.
    if (zero && !clean) platform::zero_pages(base + offset, need - offset);
  } else {
    std::size_t grow = map_align == kChunkSize && need < kMinGrow && fresh_rest_fits(kMinGrow - need) ? kMinGrow : need;
    base = static_cast<char*>(platform::map_aligned(grow, map_align));
    if (base == nullptr) base = static_cast<char*>(map_aligned_or_flush_caches(grow = need, map_align));
    if (base == nullptr) return nullptr;
    stats::add(&stats::Stripe::large_bytes_mapped, static_cast<std::int64_t>(grow));
    if (grow > need) cache_rest_of_fresh(base + need, grow - need, platform::now_ms());
    decay_if_due();
  }
  return finish(base, map_size, offset, map_align, owner);
}

LargeHeader* large_header_of(const void* p, std::uint8_t kind) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  // Only the block start the region byte names has its header page mapped below it: past the
  // mapping's end, the rest of the region may be unmapped.
  if ((a & kChunkMask) != region_large_offset(kind)) return nullptr;
  auto* h = reinterpret_cast<LargeHeader*>(a - kOsPageSize);
  if (h->check != (kLargeMagic ^ a)) return nullptr;
  return h;
}

std::size_t large_usable_size(const void* p, const LargeHeader* h) {
  return static_cast<std::size_t>(h->base + h->map_size - static_cast<const char*>(p));
}

namespace {

// p stops being a block: a second free of it fails validation.
void forget_block(void* p, LargeHeader* h) {
  h->check = 0;
  region_set(reinterpret_cast<std::uintptr_t>(p), kRegionNone);
  stats::add(&stats::Stripe::large_live_blocks, -1);
  stats::add(&stats::Stripe::large_bytes_in_use, -static_cast<std::int64_t>(large_usable_size(p, h)));
}

void cache_or_unmap(char* base, std::size_t size) {
  if (cache_put(base, size, platform::now_ms())) {
    decay_if_due();
    return;
  }
  unmap_mapping(base, size);
}

// Bytes of mappings in threads' stashes (large_free_to), for large_cache_resident_bytes.
std::atomic<std::size_t> g_stashed_bytes{0};

void count_stashed(std::size_t size, bool in) {
  auto delta = static_cast<std::int64_t>(size);
  stats::add(&stats::Stripe::large_bytes_cached, in ? delta : -delta);
  if (in) g_stashed_bytes.fetch_add(size, std::memory_order_relaxed);
  else g_stashed_bytes.fetch_sub(size, std::memory_order_relaxed);
}

}  // namespace

void large_free(void* p, LargeHeader* h) {
  char* base = h->base;
  std::size_t size = h->map_size;
  bool cacheable = h->alignment == kChunkSize;
  forget_block(p, h);
  if (cacheable) return cache_or_unmap(base, size);
  unmap_mapping(base, size);
}

bool large_free_to(void* p, LargeHeader* h, std::size_t max_user, const void* owner, LargeMapping* out) {
  if (h->owner != owner || h->alignment != kChunkSize || h->map_size - kOsPageSize > max_user) return false;
  *out = LargeMapping{h->base, h->map_size};
  forget_block(p, h);
  count_stashed(out->size, true);
  return true;
}

void* large_alloc_from(LargeMapping m, std::size_t size, bool zero, const void* owner) {
  std::size_t offset, map_align;
  placement(kMinAlign, &offset, &map_align);
  if (size > m.size) return nullptr;
  std::size_t need = round_up(offset + size, kOsPageSize);
  if (need > m.size || need < m.size / 2) return nullptr;
  count_stashed(m.size, false);
  if (zero) platform::zero_pages(m.base + offset, need - offset);
  return finish(m.base, m.size, offset, map_align, owner);
}

void large_give(LargeMapping m) {
  count_stashed(m.size, false);
  cache_or_unmap(m.base, m.size);
}

std::atomic<void (*)(void*)> g_large_moved_test_hook{nullptr};

bool large_resize_in_place(void* p, LargeHeader* h, std::size_t new_size) {
  char* base = h->base;
  std::size_t offset = static_cast<std::size_t>(static_cast<char*>(p) - base);
  if (new_size > (std::size_t{1} << 62)) return false;
  std::size_t need = round_up(offset + new_size, kOsPageSize);
  std::size_t old = h->map_size;
  if (need <= old) {
    // Shrink only when it frees at least half: realloc down-and-up cycles stay in place.
    if (need <= old / 2 && platform::remap_in_place(base, old, need)) {
      h->map_size = need;
      stats::add(&stats::Stripe::large_bytes_mapped, -static_cast<std::int64_t>(old - need));
      stats::add(&stats::Stripe::large_bytes_in_use, -static_cast<std::int64_t>(old - need));
    }
    return true;
  }
  // The cached space right after the mapping, else the kernel's (only a default-aligned
  // mapping's neighbours are cached).
  if (h->alignment == kChunkSize && cache_take_adjacent(base + old, need - old)) {
    h->map_size = need;
    stats::add(&stats::Stripe::large_bytes_in_use, static_cast<std::int64_t>(need - old));
    return true;
  }
  if (platform::remap_in_place(base, old, need)) {
    h->map_size = need;
    stats::add(&stats::Stripe::large_bytes_mapped, static_cast<std::int64_t>(need - old));
    stats::add(&stats::Stripe::large_bytes_in_use, static_cast<std::int64_t>(need - old));
    return true;
  }
  return false;
}

void* large_realloc(void* p, LargeHeader* h, std::size_t new_size) {
  if (new_size > (std::size_t{1} << 62)) return nullptr;
  if (large_resize_in_place(p, h, new_size)) return p;
  char* base = h->base;
  std::size_t offset = static_cast<std::size_t>(static_cast<char*>(p) - base);
  std::size_t need = round_up(offset + new_size, kOsPageSize);
  std::size_t old = h->map_size;
  // Move the pages (not the bytes) to a fresh aligned reservation: mremap with MREMAP_FIXED
  // keeps the alignment that the region map relies on.
  char* target = static_cast<char*>(map_aligned_or_flush_caches(need, h->alignment));
  if (target == nullptr) return nullptr;
  // Unmark p's region while the pages are still there: once they move, another thread may map
  // a block in the space they leave and mark the region as its own.
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t code = region_kind(a);
  region_set(a, kRegionNone);
  if (!platform::remap_to(base, old, target, need)) {
    region_set(a, code);
    platform::unmap(target, need);
    return nullptr;
  }
  if (auto hook = g_large_moved_test_hook.load(std::memory_order_relaxed); hook != nullptr) hook(p);
  char* np = target + offset;
  auto* nh = reinterpret_cast<LargeHeader*>(np - kOsPageSize);
  nh->check = kLargeMagic ^ reinterpret_cast<std::uintptr_t>(np);
  nh->base = target;
  nh->map_size = need;
  region_set(reinterpret_cast<std::uintptr_t>(np), code);  // target is aligned as base was
  stats::add(&stats::Stripe::large_bytes_mapped, static_cast<std::int64_t>(need - old));
  stats::add(&stats::Stripe::large_bytes_in_use, static_cast<std::int64_t>(need - old));
  return np;
}

std::size_t large_cache_decay(std::uint64_t now_ms, bool* pending) {
  auto delay = static_cast<std::uint64_t>(options::get(options::Id::kLargeDecayMs));
  std::size_t bytes = 0;
  for (;;) {
    CacheEntry aged;
    {
      LockGuard g(g_lock);
      int i = oldest_entry(/*dirty_only=*/true);
      if (i < 0) {
        refresh_oldest_dirty();
        return bytes;
      }
      std::uint64_t freed = g_cache[i].freed_ms;
      if (now_ms < freed || now_ms - freed < delay) {
        if (pending != nullptr) *pending = true;
        refresh_oldest_dirty();
        return bytes;
      }
      aged = remove_entry(static_cast<unsigned>(i));
    }
    bytes += aged.dirty;
    decommit_and_return(aged);
  }
}

std::size_t large_cache_flush() {
  LockGuard g(g_lock);
  std::size_t bytes = 0;
  while (g_cache_used > 0) {
    CacheEntry e = remove_entry(g_cache_used - 1);
    unmap_mapping(e.base, e.size);
    bytes += e.size;
  }
  return bytes;
}

void* map_aligned_or_flush_caches(std::size_t size, std::size_t alignment) {
  void* p = platform::map_aligned(size, alignment);
  if (p == nullptr && large_cache_flush() + chunk_cache_flush() != 0) p = platform::map_aligned(size, alignment);
  return p;
}

std::size_t large_cache_resident_bytes() {
  // The dirty ranges, copied under the lock and measured outside it: mincore takes no lock of
  // ours and shoots down no TLB, but the cache's other users should not wait for it. An entry
  // taken or unmapped meanwhile is measured as its range is then (where mincore fails, by its
  // size): statistics read while threads run are each as of its own moment (brisk.h).
  struct Range {
    char* start;
    std::size_t size;
  };
  Range ranges[kCacheEntries];
  unsigned n = 0;
  {
    LockGuard g(g_lock);
    for (unsigned i = 0; i < g_cache_used; ++i) {
      const CacheEntry& e = g_cache[i];
      if (e.dirty != 0) ranges[n++] = Range{e.base + e.dirty_begin, e.dirty_end - e.dirty_begin};
    }
  }
  std::size_t bytes = g_stashed_bytes.load(std::memory_order_relaxed);
  for (unsigned i = 0; i < n; ++i) bytes += platform::resident_bytes(ranges[i].start, ranges[i].size);
  return bytes;
}

LargeCacheView large_cache_view_for_test(LargeCacheEntryView* out, std::size_t max) {
  BRISK_ASSERT(g_lock.is_locked());
  for (unsigned i = 0; i < g_cache_used && i < max; ++i) {
    const CacheEntry& e = g_cache[i];
    out[i] = LargeCacheEntryView{e.base, e.size, e.dirty, e.dirty_begin, e.dirty_end, e.freed_ms, g_fit[i] == fit_key(e)};
  }
  return LargeCacheView{g_cache_used, g_cache_bytes, g_dirty_bytes, g_oldest_dirty_ms.load(std::memory_order_relaxed)};
}

void large_locks_acquire() { g_lock.lock(); }
void large_locks_release() { g_lock.unlock(); }
void large_locks_reset_in_child() { g_lock.reset_after_fork(); }
LockCounts large_lock_counts() { return g_lock.counts(); }

}  // namespace brisk
