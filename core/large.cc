#include "core/large.h"

#include <atomic>
#include <cstring>

#include "core/chunk.h"
#include "core/config.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"

namespace brisk {
namespace {

constexpr std::uint64_t kLargeMagic = 0x6272736b6c617267ull;  // "brsklarg"
constexpr unsigned kCacheEntries = 64;

struct CacheEntry {
  char* base;
  std::size_t size;
  std::size_t resident;  // bytes resident when cached; 0 for a clean (decommitted) entry
  bool dirty;            // a clean entry was decommitted and reads as zeros
};

// The cache of freed mappings, all kChunkSize-aligned, in two budgets:
//   - address space (BRISK_LARGE_CACHE_BYTES): what reuse saves is mmap, the aligned-mapping
//     trim and munmap, and address space costs no memory;
//   - resident bytes (BRISK_LARGE_DIRTY_BYTES): mappings kept with their pages, so that reuse
//     also skips the page faults. The budget counts pages really resident (mincore), not the
//     mapping's size: a program that maps 100 MiB and touches 40 KiB of it keeps 40 KiB.
//     Past the budget a freed mapping is decommitted (MADV_DONTNEED) before it is cached.
//     Measured on MMtest's large test (10 threads): decommitting every freed mapping made
//     madvise 59% of the system time, through TLB shootdowns.
// jemalloc's retained and dirty extents follow the same two-level idea.
SpinLock g_lock;
CacheEntry g_cache[kCacheEntries];
unsigned g_cache_used = 0;
std::atomic<unsigned> g_cache_entries{0};  // g_cache_used, readable without the lock
std::size_t g_cache_bytes = 0;
std::size_t g_dirty_bytes = 0;

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

void remove_entry(unsigned i) {
  const CacheEntry& e = g_cache[i];
  g_cache_bytes -= e.size;
  g_dirty_bytes -= e.resident;
  stats::add(stats::g.large_bytes_cached, -static_cast<std::int64_t>(e.size));
  g_cache[i] = g_cache[--g_cache_used];
  g_cache_entries.store(g_cache_used, std::memory_order_relaxed);
}

// A cached mapping of at least `need` bytes, trimmed to `need`. *clean: it reads as zeros;
// *resident: bytes of it resident when it was cached.
char* cache_take(std::size_t need, bool* clean, std::size_t* resident) {
  if (g_cache_entries.load(std::memory_order_relaxed) == 0) return nullptr;
  char* base;
  std::size_t size;
  {
    LockGuard g(g_lock);
    int best = -1;
    for (unsigned i = 0; i < g_cache_used; ++i) {
      const CacheEntry& e = g_cache[i];
      // Best fit, wasting at most a quarter, and dirty before clean at equal size: a dirty
      // mapping's pages are already there.
      if (e.size < need || e.size - need > need / 4) continue;
      if (best < 0 || e.size < g_cache[best].size || (e.size == g_cache[best].size && e.dirty))
        best = static_cast<int>(i);
    }
    if (best < 0) return nullptr;
    base = g_cache[best].base;
    size = g_cache[best].size;
    *clean = !g_cache[best].dirty;
    *resident = g_cache[best].resident;
    remove_entry(static_cast<unsigned>(best));
  }
  // The caller expects exactly `need` bytes mapped: give the tail back.
  if (size > need) {
    platform::unmap(base + need, size - need);
    stats::add(stats::g.large_bytes_mapped, -static_cast<std::int64_t>(size - need));
  }
  return base;
}

bool cache_put(char* base, std::size_t size) {
  std::size_t limit = static_cast<std::size_t>(options::get(options::Id::kLargeCacheBytes));
  std::size_t dirty_limit = static_cast<std::size_t>(options::get(options::Id::kLargeDirtyBytes));
  if (size > limit) return false;
  std::size_t resident = platform::resident_bytes(base, size);
  {
    LockGuard g(g_lock);
    if (g_cache_used == kCacheEntries || g_cache_bytes + size > limit) return false;
    if (g_dirty_bytes + resident <= dirty_limit) {
      g_cache[g_cache_used++] = CacheEntry{base, size, resident, true};
      g_cache_bytes += size;
      g_dirty_bytes += resident;
      g_cache_entries.store(g_cache_used, std::memory_order_relaxed);
      stats::add(stats::g.large_bytes_cached, static_cast<std::int64_t>(size));
      return true;
    }
  }
  // Decommit before the mapping becomes visible in the cache: another thread may take it at once.
  platform::decommit(base, size);
  LockGuard g(g_lock);
  if (g_cache_used == kCacheEntries || g_cache_bytes + size > limit) return false;
  g_cache[g_cache_used++] = CacheEntry{base, size, 0, false};
  g_cache_bytes += size;
  g_cache_entries.store(g_cache_used, std::memory_order_relaxed);
  stats::add(stats::g.large_bytes_cached, static_cast<std::int64_t>(size));
  return true;
}

void* finish(char* base, std::size_t map_size, std::size_t offset, std::size_t map_align) {
  char* p = base + offset;
  auto* h = reinterpret_cast<LargeHeader*>(p - kOsPageSize);
  h->check = kLargeMagic ^ reinterpret_cast<std::uintptr_t>(p);
  h->base = base;
  h->map_size = map_size;
  h->alignment = map_align;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  region_set(a, region_large_code(a & kChunkMask));
  stats::add(stats::g.large_live_blocks, 1);
  stats::add(stats::g.large_bytes_in_use, static_cast<std::int64_t>(map_size - offset));
  return p;
}

}  // namespace

void* large_alloc(std::size_t size, std::size_t alignment, bool zero) {
  std::size_t offset, map_align;
  placement(alignment, &offset, &map_align);
  // A power-of-two alignment (the entry points check it) puts p where its region byte can say.
  if (size > (std::size_t{1} << 62) || offset > (std::size_t{1} << 62) || (alignment & (alignment - 1)) != 0)
    return nullptr;
  std::size_t need = round_up(offset + size, kOsPageSize);
  bool clean = false;
  std::size_t resident = 0;
  char* base = map_align == kChunkSize ? cache_take(need, &clean, &resident) : nullptr;
  if (base != nullptr) {
    // A reused dirty mapping holds old contents. For calloc: writing zeros over pages that are
    // resident is far cheaper than dropping them and faulting them back (measured: a 4 MiB
    // calloc touched page by page took 12.4 ms after MADV_DONTNEED, against 82 us for a memset
    // of resident memory under mimalloc); a mostly untouched mapping is dropped instead.
    if (zero && !clean) {
      if (resident >= (need - offset) / 2) {
        std::memset(base + offset, 0, size);
      } else {
        platform::decommit(base + offset, need - offset);
      }
    }
  } else {
    base = static_cast<char*>(platform::map_aligned(need, map_align));
    if (base == nullptr) return nullptr;
    stats::add(stats::g.large_bytes_mapped, static_cast<std::int64_t>(need));
  }
  return finish(base, need, offset, map_align);
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

void large_free(void* p, LargeHeader* h) {
  char* base = h->base;
  std::size_t size = h->map_size;
  bool cacheable = h->alignment == kChunkSize;
  h->check = 0;  // a second free of p now fails validation
  region_set(reinterpret_cast<std::uintptr_t>(p), kRegionNone);
  stats::add(stats::g.large_live_blocks, -1);
  stats::add(stats::g.large_bytes_in_use, -static_cast<std::int64_t>(large_usable_size(p, h)));
  if (cacheable && cache_put(base, size)) return;
  platform::unmap(base, size);
  stats::add(stats::g.large_bytes_mapped, -static_cast<std::int64_t>(size));
}

std::atomic<void (*)(void*)> g_large_moved_test_hook{nullptr};

void* large_realloc(void* p, LargeHeader* h, std::size_t new_size) {
  char* base = h->base;
  std::size_t offset = static_cast<std::size_t>(static_cast<char*>(p) - base);
  if (new_size > (std::size_t{1} << 62)) return nullptr;
  std::size_t need = round_up(offset + new_size, kOsPageSize);
  std::size_t old = h->map_size;
  if (need <= old) {
    // Shrink only when it frees at least half: realloc down-and-up cycles stay in place.
    if (need <= old / 2 && platform::remap_in_place(base, old, need)) {
      h->map_size = need;
      stats::add(stats::g.large_bytes_mapped, -static_cast<std::int64_t>(old - need));
      stats::add(stats::g.large_bytes_in_use, -static_cast<std::int64_t>(old - need));
    }
    return p;
  }
  if (platform::remap_in_place(base, old, need)) {
    h->map_size = need;
    stats::add(stats::g.large_bytes_mapped, static_cast<std::int64_t>(need - old));
    stats::add(stats::g.large_bytes_in_use, static_cast<std::int64_t>(need - old));
    return p;
  }
  // Move the pages (not the bytes) to a fresh aligned reservation: mremap with MREMAP_FIXED
  // keeps the alignment that the region map relies on.
  char* target = static_cast<char*>(platform::map_aligned(need, h->alignment));
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
  stats::add(stats::g.large_bytes_mapped, static_cast<std::int64_t>(need - old));
  stats::add(stats::g.large_bytes_in_use, static_cast<std::int64_t>(need - old));
  return np;
}

std::size_t large_cache_flush() {
  LockGuard g(g_lock);
  std::size_t bytes = 0;
  while (g_cache_used > 0) {
    CacheEntry e = g_cache[g_cache_used - 1];
    remove_entry(g_cache_used - 1);
    platform::unmap(e.base, e.size);
    stats::add(stats::g.large_bytes_mapped, -static_cast<std::int64_t>(e.size));
    bytes += e.size;
  }
  return bytes;
}

std::size_t large_cache_resident_bytes() {
  LockGuard g(g_lock);
  return g_dirty_bytes;
}

void large_locks_acquire() { g_lock.lock(); }
void large_locks_release() { g_lock.unlock(); }
void large_locks_reset_in_child() { g_lock.reset_after_fork(); }

}  // namespace brisk
