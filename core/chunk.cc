// Chunk page management, the region map, the chunk cache and the abandoned-chunk list.
#include "core/chunk.h"

#include <cstring>

#include "core/assert.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"

namespace brisk {

std::uint8_t g_region_map[kRegionMapEntries];

void region_set(std::uintptr_t p, std::uint8_t kind) {
  std::uintptr_t i = p >> kChunkShift;
  if (i < kRegionMapEntries) __atomic_store_n(&g_region_map[i], kind, __ATOMIC_RELEASE);
}

void chunk_list_push(Chunk*& head, Chunk* c) {
  c->prev = nullptr;
  c->next = head;
  if (head != nullptr) head->prev = c;
  head = c;
}

void chunk_list_remove(Chunk*& head, Chunk* c) {
  if (c->prev != nullptr) c->prev->next = c->next; else head = c->next;
  if (c->next != nullptr) c->next->prev = c->prev;
  c->next = c->prev = nullptr;
}

namespace {

// Empty chunks kept mapped but decommitted, so that a program that frees and reallocates a few
// chunks' worth does not pay mmap + munmap + the aligned-mapping trim each time.
SpinLock g_cache_lock;
Chunk* g_cache_head = nullptr;
std::size_t g_cache_count = 0;
std::atomic<std::size_t> g_cache_nonempty{0};  // g_cache_count, readable without the lock

// Chunks whose page owner exited.
SpinLock g_abandoned_lock;
Chunk* g_abandoned_head = nullptr;
std::atomic<std::size_t> g_abandoned_count{0};  // readable without the lock
// Set when a purge's hand-back of claimed pages emptied an abandoned chunk, which no release
// then freed; cleared by the sweep the purge makes once it lets go of the registry lock.
std::atomic<bool> g_abandoned_emptied{false};

// With no lock held: frees the abandoned chunks left empty since the last sweep, if any may be.
void sweep_emptied_abandoned() {
  if (g_abandoned_emptied.load(std::memory_order_relaxed) &&
      g_abandoned_emptied.exchange(false, std::memory_order_acquire))
    chunk_destroy_empty_abandoned();
}

void init_header(Chunk* c, Heap* owner) {
  // Field by field: the span descriptors must be zero (kind kUnused, owner null) so a free of a
  // pointer into an unused page is caught; every page maps to spans[0] until a span takes it.
  std::memset(static_cast<void*>(c), 0, sizeof(Chunk));
  c->magic = kChunkMagic;
  c->free_pages.store(kAllPagesFree, std::memory_order_relaxed);
  c->dirty_pages.store(0, std::memory_order_relaxed);
  c->page_owner.store(owner, std::memory_order_relaxed);
  for (auto& s : c->page_span) s = &c->spans[0];
}

}  // namespace

// Bit i set: pages i .. i+n-1 are all set in bits.
std::uint64_t run_starts(std::uint64_t bits, unsigned n) {
  std::uint64_t starts = bits;
  for (unsigned j = 1; j < n && starts != 0; ++j) starts &= bits >> j;
  return starts;
}

std::atomic<void (*)(Chunk*, unsigned, unsigned)> g_chunk_claim_test_hook{nullptr};

namespace {

// The free run of n pages with the most dirty (resident) pages, the lowest of equals; 0 if
// there is no free run. *dirty_out: its dirty page count.
unsigned most_resident_run(std::uint64_t free, std::uint64_t dirty, unsigned n, unsigned* dirty_out) {
  std::uint64_t starts = run_starts(free, n);
  *dirty_out = 0;
  if (starts == 0) return 0;
  if (std::uint64_t whole = run_starts(free & dirty, n); whole != 0) {
    *dirty_out = n;
    return static_cast<unsigned>(__builtin_ctzll(whole));
  }
  unsigned best = static_cast<unsigned>(__builtin_ctzll(starts));
  for (std::uint64_t rest = starts; rest != 0; rest &= rest - 1) {
    auto first = static_cast<unsigned>(__builtin_ctzll(rest));
    unsigned d = count_bits(dirty & run_mask(first, n));
    if (d > *dirty_out) {
      *dirty_out = d;
      best = first;
    }
  }
  return best;
}

// A run counts as resident when at least this many of its n pages are: all of a short run, half
// of a longer one. Medium blocks of many sizes released among each other leave resident runs
// shorter than the next block; requiring the whole run resident sent such a block to fresh
// pages while tens of MiB of resident free pages waited for their purge (prodcons).
unsigned resident_quota(unsigned n) { return n < 4 ? n : (n + 1) / 2; }

// The first `need` OS pages of a page (need 1..16).
std::uint16_t need_mask(unsigned need) {
  return need >= kPageSize / kOsPageSize ? std::uint16_t{0xffff} : static_cast<std::uint16_t>((1u << need) - 1);
}

// Whether page i's record has every OS page of `want` (need_mask) as held.
bool covers(const Chunk* c, unsigned i, std::uint16_t want) {
  return (c->os_pages[i].load(std::memory_order_relaxed) & want) == want;
}

// Of the pages in `candidates` (free and dirty, as read), the one chunk_claim_pages' need rule
// picks; 0 if there is none. *fits: its first `need` OS pages all held data.
unsigned best_page_for(Chunk* c, std::uint64_t candidates, unsigned need, bool* fits) {
  const std::uint16_t want = need_mask(need);
  unsigned best = 0, best_score = 0;
  *fits = false;
  for (std::uint64_t rest = candidates; rest != 0; rest &= rest - 1) {
    const auto i = static_cast<unsigned>(__builtin_ctzll(rest));
    const std::uint16_t held = c->os_pages[i].load(std::memory_order_relaxed);
    if ((held & want) == want) {
      // Fits: the fewest OS pages held beyond the need, so whole pages stay for whole needs.
      const unsigned score = 64 - count_bits(held);
      if (!*fits || score > best_score) {
        best = i;
        best_score = score;
        *fits = true;
      }
    } else if (!*fits) {
      const unsigned score = count_bits(held & want) + 1;
      if (score > best_score) {
        best = i;
        best_score = score;
      }
    }
  }
  return best;
}

// After a claim of the pages in m, of which was_dirty held data: the others read as zeros, and
// none of their OS pages is resident.
void clear_os_pages_of_clean(Chunk* c, std::uint64_t m, std::uint64_t was_dirty) {
  for (std::uint64_t clean = m & ~was_dirty; clean != 0; clean &= clean - 1)
    c->os_pages[__builtin_ctzll(clean)].store(0, std::memory_order_relaxed);
}

}  // namespace

bool chunk_has_resident_run(Chunk* c, unsigned n, unsigned need) {
  if (n == 1 && need > 0) {
    const std::uint16_t want = need_mask(need);
    std::uint64_t candidates =
        c->free_pages.load(std::memory_order_relaxed) & c->dirty_pages.load(std::memory_order_relaxed);
    for (; candidates != 0; candidates &= candidates - 1)
      if (covers(c, static_cast<unsigned>(__builtin_ctzll(candidates)), want)) return true;
    return false;
  }
  // Called for every chunk a heap scans (up to the registry's 128 under its lock): it stops at
  // the first run that qualifies, and short runs need no count.
  std::uint64_t free = c->free_pages.load(std::memory_order_relaxed);
  std::uint64_t dirty = c->dirty_pages.load(std::memory_order_relaxed);
  if (run_starts(free & dirty, n) != 0) return true;
  unsigned quota = resident_quota(n);
  if (quota == n) return false;
  for (std::uint64_t rest = run_starts(free, n); rest != 0; rest &= rest - 1)
    if (count_bits(dirty & run_mask(static_cast<unsigned>(__builtin_ctzll(rest)), n)) >= quota) return true;
  return false;
}

namespace {

// Claimed pages are in use: a purge check must not count the time they lay free before. Not
// under BRISK_PURGE_REUSED=1 (low-memory): a page free at two checks goes back however it was
// used in between.
void forget_age(Chunk* c, std::uint64_t m) {
  if (options::get(options::Id::kPurgeReused) != 0) return;
  if ((c->aged.load(std::memory_order_relaxed) & m) != 0) c->aged.fetch_and(~m, std::memory_order_relaxed);
  if ((c->decay_aged.load(std::memory_order_relaxed) & m) != 0) c->decay_aged.fetch_and(~m, std::memory_order_relaxed);
}

}  // namespace

unsigned chunk_claim_pages(Chunk* c, unsigned n, std::uint64_t* dirty_out, unsigned need) {
  std::uint64_t bits = c->free_pages.load(std::memory_order_acquire);
  for (;;) {
    // The run with the most pages freed recently and not purged: those are resident (often in
    // cache), where fresh pages cost a page fault each, and the kernel zeroes them: a fault
    // costs more than the memset calloc then needs (measured on the producer/consumer workload:
    // preferring zero pages for calloc faulted 47,000 times against 20,000 for tcmalloc).
    // Which run is resident is a hint only (see "Page state" in chunk.h).
    // The lowest of equals: a medium block then has the most room to grow in place above it
    // (taking medium runs from the top of the chunk made every in-place growth fail).
    unsigned dirty = 0;
    unsigned first = 0;
    if (n == 1 && need > 0) {
      bool fits;
      first = best_page_for(c, bits & c->dirty_pages.load(std::memory_order_relaxed), need, &fits);
    }
    if (first == 0) first = most_resident_run(bits, c->dirty_pages.load(std::memory_order_relaxed), n, &dirty);
    if (first == 0) return 0;
    std::uint64_t m = run_mask(first, n);
    if (auto hook = g_chunk_claim_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr))
      hook(c, first, n);
    // Releases and other claimers race with us: retry on their updates.
    if (c->free_pages.compare_exchange_weak(bits, bits & ~m, std::memory_order_acquire,
                                            std::memory_order_acquire)) {
      // The pages are ours: the dirty bits this clears are those of their last release or purge.
      std::uint64_t was_dirty = c->dirty_pages.fetch_and(~m, std::memory_order_relaxed);
      c->lazy_pages.fetch_and(~m, std::memory_order_relaxed);
      clear_os_pages_of_clean(c, m, was_dirty);
      forget_age(c, m);
      if (dirty_out != nullptr) *dirty_out = (was_dirty & m) >> first;
      return first;
    }
  }
}

bool chunk_claim_pages_at(Chunk* c, unsigned first, unsigned n) {
  if (first == 0 || first + n > kPagesPerChunk) return false;
  std::uint64_t m = run_mask(first, n);
  std::uint64_t bits = c->free_pages.load(std::memory_order_acquire);
  for (;;) {
    if ((bits & m) != m) return false;
    if (c->free_pages.compare_exchange_weak(bits, bits & ~m, std::memory_order_acquire,
                                            std::memory_order_acquire)) {
      std::uint64_t was_dirty = c->dirty_pages.fetch_and(~m, std::memory_order_relaxed);
      c->lazy_pages.fetch_and(~m, std::memory_order_relaxed);
      clear_os_pages_of_clean(c, m, was_dirty);
      forget_age(c, m);
      return true;
    }
  }
}

void chunk_note_written(Chunk* c, unsigned first, unsigned n, std::uint64_t written) {
  constexpr unsigned kOsPerPage = kPageSize / kOsPageSize;
  const bool whole = n * kOsPerPage > 64;  // no mask bit for its later pages: all written
  for (unsigned i = first; i < first + n; ++i) {
    const auto bits = whole ? std::uint16_t{0xffff} : static_cast<std::uint16_t>(written >> ((i - first) * kOsPerPage));
    if (bits != 0) c->os_pages[i].fetch_or(bits, std::memory_order_relaxed);
  }
}

bool chunk_release_pages(Chunk* c, unsigned first, unsigned n, std::uint64_t written) {
  std::uint64_t m = run_mask(first, n);
  for (unsigned i = first; i < first + n; ++i) c->page_span[i] = &c->spans[0];
  chunk_note_written(c, first, n, written);
  // Dirty before free: chunk_purge only decommits pages it sees both free and dirty.
  c->dirty_pages.fetch_or(m, std::memory_order_relaxed);
  std::uint64_t before = c->free_pages.fetch_or(m, std::memory_order_release);
  BRISK_ASSERT((before & m) == 0);  // only their claimer releases pages, once
  return (before | m) == kAllPagesFree;
}

namespace {

// Appends the runs of pages in mask to ranges[*n] (a mask has at most 32 runs).
void add_runs(Chunk* c, std::uint64_t mask, platform::PageRange* ranges, std::size_t* n) {
  for_each_bit_run(mask, [c, ranges, n](unsigned first, unsigned count) {
    ranges[(*n)++] = platform::PageRange{c->page_address(first), std::size_t{count} << kPageShift};
  });
}

unsigned count_runs(std::uint64_t mask) { return count_bits(mask & ~(mask << 1)); }

// Decommits the pages in mask, which the caller has claimed, in one call where the kernel
// batches (ChunkPurgeBatch's reason), and returns their bytes.
std::size_t decommit_pages(Chunk* c, std::uint64_t mask) {
  static_assert(kPagesPerChunk / 2 <= platform::kMaxDecommitRanges);
  platform::PageRange runs[kPagesPerChunk / 2];
  std::size_t n = 0;
  add_runs(c, mask, runs, &n);
  platform::decommit_all(runs, n);
  return std::size_t{count_bits(mask)} << kPageShift;
}

// Gives a chunk no one can reach any more back to the OS.
void unmap_chunk(Chunk* c) {
  region_set(reinterpret_cast<std::uintptr_t>(c), kRegionNone);
  c->magic = 0;
  platform::unmap(c, kChunkSize);
  stats::add(stats::g.chunks_mapped, -1);
}

// Every live chunk (not the cached ones), so that a heap whose own chunks are full can use the
// free pages of others' before mapping a new chunk. Adding and destroying a chunk take this lock
// as writers, so a chunk seen by a reader stays mapped while the reader holds it. Everything
// else only reads the list (scans, purges, stats), and changes chunks only through their
// atomic bitmaps: readers exclude no one but writers, so heaps scanning for free pages (as often
// as once per medium span) do not wait for each other.
SharedSpinLock g_registry_lock;
Chunk* g_registry_head = nullptr;
constexpr unsigned kMaxRegistryScan = 128;

void registry_add(Chunk* c) {
  LockGuard g(g_registry_lock);
  c->reg_prev = nullptr;
  c->reg_next = g_registry_head;
  if (g_registry_head != nullptr) g_registry_head->reg_prev = c;
  g_registry_head = c;
}

void registry_remove_locked(Chunk* c) {
  if (c->reg_prev != nullptr) c->reg_prev->reg_next = c->reg_next; else g_registry_head = c->reg_next;
  if (c->reg_next != nullptr) c->reg_next->reg_prev = c->reg_prev;
  c->reg_next = c->reg_prev = nullptr;
}

}  // namespace

Chunk* chunk_claim_shared(Heap* h, unsigned n, bool resident_only, unsigned* first, std::uint64_t* dirty,
                          unsigned need) {
  SharedLockGuard g(g_registry_lock);
  const int last_pass = need > 0 ? 0 : 1;
  for (int pass = resident_only || need > 0 ? 0 : 1; pass <= last_pass; ++pass) {
    unsigned scanned = 0;
    for (Chunk* c = g_registry_head; c != nullptr && scanned < kMaxRegistryScan; c = c->reg_next, ++scanned) {
      if (c->page_owner.load(std::memory_order_relaxed) == h) continue;
      if (pass == 0 ? !chunk_has_resident_run(c, n, need)
                    : run_starts(c->free_pages.load(std::memory_order_relaxed), n) == 0)
        continue;
      unsigned f = chunk_claim_pages(c, n, dirty, need);
      if (f != 0) {
        *first = f;
        return c;
      }
    }
  }
  return nullptr;
}

std::size_t ChunkPurgeBatch::add(Chunk* c, std::uint64_t only) {
  // Claim the free dirty pages first, so that no thread growing a medium block in place can
  // take one while it is being decommitted; give them back afterwards, clean (flush).
  std::uint64_t bits = c->free_pages.load(std::memory_order_acquire);
  std::uint64_t d;
  do {
    d = bits & c->dirty_pages.load(std::memory_order_relaxed) & only;
    if (lazy_) d &= ~c->lazy_pages.load(std::memory_order_relaxed);
    if (d == 0) return 0;
  } while (!c->free_pages.compare_exchange_weak(bits, bits & ~d, std::memory_order_acquire,
                                                std::memory_order_acquire));
  // The pages in d are ours: give back those whose dirty bit is still set now, not as read
  // above (and, lazily, not lazy already). An eager purge clears their dirty and lazy bits
  // now; no one reads them before the pages are handed back.
  std::uint64_t advised;
  if (lazy_) {
    advised = c->dirty_pages.load(std::memory_order_relaxed) & d & ~c->lazy_pages.load(std::memory_order_relaxed);
  } else {
    advised = c->dirty_pages.fetch_and(~d, std::memory_order_relaxed) & d;
    c->lazy_pages.fetch_and(~d, std::memory_order_relaxed);
  }
  if (ranges_ + count_runs(advised) > kRanges || claims_ == kClaims) flush();
  add_runs(c, advised, range_, &ranges_);
  claim_[claims_++] = Claim{c, d, advised};
  return std::size_t{count_bits(advised)} << kPageShift;
}

void ChunkPurgeBatch::flush() {
  if (claims_ == 0) return;
  if (lazy_) platform::lazy_free_all(range_, ranges_);
  else platform::decommit_all(range_, ranges_);
  for (std::size_t i = 0; i < claims_; ++i) {
    Chunk* c = claim_[i].chunk;
    if (lazy_) c->lazy_pages.fetch_or(claim_[i].advised, std::memory_order_relaxed);  // dirty stays: they may hold data
    const std::uint64_t before = c->free_pages.fetch_or(claim_[i].claimed, std::memory_order_release);
    // A release into an abandoned chunk while these pages were claimed saw the chunk not yet
    // empty and left it listed: if this hand-back empties it, the caller sweeps once it lets go
    // of the registry lock (which chunk_destroy takes). c is mapped meanwhile (see the class).
    if ((before | claim_[i].claimed) == kAllPagesFree && c->page_owner.load(std::memory_order_acquire) == nullptr)
      g_abandoned_emptied.store(true, std::memory_order_release);
  }
  ranges_ = claims_ = 0;
}

std::size_t chunk_purge(Chunk* c, std::uint64_t only, bool lazy) {
  ChunkPurgeBatch batch(lazy);
  return batch.add(c, only);
}

std::size_t chunk_purge_all() {
  std::size_t bytes = 0;
  {
    // Under the registry lock, so no chunk_destroy runs meanwhile: the chunks stay mapped, and
    // no destroy fails for pages this purge holds for a moment. (The last release into an
    // abandoned chunk can still find those pages taken and leave the chunk listed, empty: the
    // hand-back notes it, and the sweep below frees it.)
    SharedLockGuard g(g_registry_lock);
    ChunkPurgeBatch batch;  // sent before the lock is let go
    for (Chunk* c = g_registry_head; c != nullptr; c = c->reg_next) bytes += batch.add(c);
  }
  sweep_emptied_abandoned();
  return bytes;
}

std::size_t chunk_decay_all(bool* pending, bool lazy, bool (*decays)(const Heap* page_owner)) {
  std::size_t bytes = 0;
  bool left = false;
  {
    // decay_aged is stored only here, by the background pass (one at a time, under its pass lock).
    SharedLockGuard g(g_registry_lock);
    ChunkPurgeBatch batch(lazy);  // sent before the lock is let go
    for (Chunk* c = g_registry_head; c != nullptr; c = c->reg_next) {
      if (!decays(c->page_owner.load(std::memory_order_relaxed))) {
        c->decay_aged.store(0, std::memory_order_relaxed);
        continue;
      }
      std::uint64_t free_dirty = c->free_pages.load(std::memory_order_acquire) & c->dirty_pages.load(std::memory_order_relaxed);
      if (lazy) free_dirty &= ~c->lazy_pages.load(std::memory_order_relaxed);
      std::uint64_t stale = free_dirty & c->decay_aged.load(std::memory_order_relaxed);
      if (stale != 0) bytes += batch.add(c, stale);
      std::uint64_t aged = free_dirty & ~stale;
      c->decay_aged.store(aged, std::memory_order_relaxed);
      left |= aged != 0;
    }
  }
  sweep_emptied_abandoned();  // abandoned chunks the decay's claims kept from being freed
  *pending = left;
  return bytes;
}

void chunk_for_each_live(void (*visit)(Chunk* c, void* context), void* context) {
  SharedLockGuard g(g_registry_lock);
  for (Chunk* c = g_registry_head; c != nullptr; c = c->reg_next) visit(c, context);
}

Chunk* chunk_create(Heap* owner) {
  Chunk* c = nullptr;
  if (g_cache_nonempty.load(std::memory_order_relaxed) != 0) {
    LockGuard g(g_cache_lock);
    c = g_cache_head;
    if (c != nullptr) {
      chunk_list_remove(g_cache_head, c);
      g_cache_nonempty.store(--g_cache_count, std::memory_order_relaxed);
      stats::add(stats::g.chunks_cached, -1);
    }
  }
  if (c == nullptr) {
    c = static_cast<Chunk*>(map_aligned_or_flush_caches(kChunkSize, kChunkSize));
    if (c == nullptr) return nullptr;
    stats::add(stats::g.chunks_mapped, 1);
    region_set(reinterpret_cast<std::uintptr_t>(c), kRegionChunk);
  }
  init_header(c, owner);
  registry_add(c);
  return c;
}

bool chunk_destroy(Chunk* c) {
  {
    // Take every page at once: fails if another heap claimed some since the caller saw the
    // chunk empty (chunk_claim_shared), and then the chunk lives on.
    LockGuard g(g_registry_lock);
    std::uint64_t expected = kAllPagesFree;
    if (!c->free_pages.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return false;
    registry_remove_locked(c);
  }
  std::size_t limit = static_cast<std::size_t>(options::get(options::Id::kChunkCache));
  if (limit > 0) {
    // Cached chunks hold no resident pages but their header.
    decommit_pages(c, c->dirty_pages.load(std::memory_order_relaxed) & kAllPagesFree);
    c->dirty_pages.store(0, std::memory_order_relaxed);
    c->lazy_pages.store(0, std::memory_order_relaxed);
    LockGuard g(g_cache_lock);
    if (g_cache_count < limit) {
      c->page_owner.store(nullptr, std::memory_order_relaxed);
      chunk_list_push(g_cache_head, c);
      g_cache_nonempty.store(++g_cache_count, std::memory_order_relaxed);
      stats::add(stats::g.chunks_cached, 1);
      return true;
    }
  }
  unmap_chunk(c);
  return true;
}

std::size_t chunk_cache_flush() {
  Chunk* list = nullptr;
  {
    LockGuard g(g_cache_lock);
    list = g_cache_head;
    g_cache_head = nullptr;
    stats::add(stats::g.chunks_cached, -static_cast<std::int64_t>(g_cache_count));
    g_cache_count = 0;
    g_cache_nonempty.store(0, std::memory_order_relaxed);
  }
  std::size_t bytes = 0;
  while (list != nullptr) {
    Chunk* c = list;
    list = c->next;
    unmap_chunk(c);
    bytes += kChunkSize;
  }
  return bytes;
}

namespace {
void abandoned_push_locked(Chunk* c) {
  c->abandoned = true;
  chunk_list_push(g_abandoned_head, c);
  g_abandoned_count.fetch_add(1, std::memory_order_relaxed);
}

void abandoned_remove_locked(Chunk* c) {
  chunk_list_remove(g_abandoned_head, c);
  c->abandoned = false;
  g_abandoned_count.fetch_sub(1, std::memory_order_relaxed);
}

// c, ownerless, off the abandoned list and seen empty, goes to the chunk cache or the OS; or onto
// the abandoned list if another heap or a purge has just claimed pages in it. Those pages may
// come back before c is listed, when their release or hand-back cannot see it abandoned (no one
// but this caller may free c meanwhile): so the list takes c only while they are still out,
// checked under its lock, which their release and the sweep after a hand-back need too.
void destroy_or_keep_abandoned(Chunk* c) {
  while (!chunk_destroy(c)) {
    LockGuard g(g_abandoned_lock);
    if (c->free_pages.load(std::memory_order_acquire) != kAllPagesFree) {
      abandoned_push_locked(c);
      return;
    }
  }
}
}  // namespace

void chunk_abandon(Chunk* c) {
  {
    LockGuard g(g_abandoned_lock);
    c->page_owner.store(nullptr, std::memory_order_release);
    if (c->free_pages.load(std::memory_order_acquire) != kAllPagesFree) {
      abandoned_push_locked(c);
      return;
    }
  }
  destroy_or_keep_abandoned(c);
}

Chunk* chunk_adopt(Heap* new_owner) {
  if (g_abandoned_count.load(std::memory_order_relaxed) == 0) return nullptr;
  LockGuard g(g_abandoned_lock);
  for (Chunk* c = g_abandoned_head; c != nullptr; c = c->next) {
    if (c->free_pages.load(std::memory_order_relaxed) != 0) {
      abandoned_remove_locked(c);
      c->page_owner.store(new_owner, std::memory_order_release);
      return c;
    }
  }
  return nullptr;
}

namespace {

// fn(page, bit) for each whole OS page in [from, to) of the chunk at base: its page's index and
// its bit in that page's os_pages word, until fn returns true. True if it did.
template <typename Fn>
bool for_each_os_page(std::uintptr_t base, std::uintptr_t from, std::uintptr_t to, Fn fn) {
  for (std::uintptr_t p = round_to_os_page(from); p + kOsPageSize <= to; p += kOsPageSize) {
    const auto page = static_cast<unsigned>((p - base) >> kPageShift);
    const auto bit = static_cast<std::uint16_t>(1u << (((p - base) & (kPageSize - 1)) / kOsPageSize));
    if (fn(page, bit)) return true;
  }
  return false;
}

}  // namespace

void chunk_forget_os_pages(Chunk* c, std::uintptr_t from, std::uintptr_t to) {
  for_each_os_page(reinterpret_cast<std::uintptr_t>(c), from, to, [c](unsigned page, std::uint16_t bit) {
    c->os_pages[page].fetch_and(static_cast<std::uint16_t>(~bit), std::memory_order_relaxed);
    return false;
  });
}

bool chunk_os_pages_written(const Chunk* c, std::uintptr_t from, std::uintptr_t to) {
  return for_each_os_page(reinterpret_cast<std::uintptr_t>(c), from, to, [c](unsigned page, std::uint16_t bit) {
    return (c->os_pages[page].load(std::memory_order_relaxed) & bit) != 0;
  });
}

void chunk_release_span_pages(Chunk* c, unsigned first, unsigned n, std::uint64_t written) {
  // Once its last pages are back, an owned chunk may be destroyed by its owner's purge at any
  // moment (and unmapped: low-memory keeps one cached chunk), so nothing of c may be read after
  // the release. Whether c is abandoned is therefore read before, under the abandoned-list lock,
  // which every change of that flag holds, and nobody frees an abandoned chunk without it.
  // Only a release that looks as if it will empty the chunk takes the lock; two that empty it
  // together each see the other's pages still taken, and the one whose release empties it
  // sweeps the abandoned list (so does a purge whose claimed pages were the last taken).
  if ((c->free_pages.load(std::memory_order_relaxed) | run_mask(first, n)) != kAllPagesFree) {
    // Emptied after all: another release or a purge's hand-back came between the check and
    // this one. c may be gone already, if owned; if abandoned, it is on the list, which the
    // sweep walks without reading c itself.
    if (chunk_release_pages(c, first, n, written)) chunk_destroy_empty_abandoned();
    return;
  }
  {
    LockGuard g(g_abandoned_lock);
    bool abandoned = c->abandoned;
    if (!chunk_release_pages(c, first, n, written) || !abandoned) return;
    abandoned_remove_locked(c);
  }
  destroy_or_keep_abandoned(c);
}

void chunk_destroy_empty_abandoned() {
  Chunk* empty = nullptr;
  {
    LockGuard g(g_abandoned_lock);
    for (Chunk* c = g_abandoned_head; c != nullptr;) {
      Chunk* next = c->next;
      if (c->free_pages.load(std::memory_order_acquire) == kAllPagesFree) {
        abandoned_remove_locked(c);
        chunk_list_push(empty, c);
      }
      c = next;
    }
  }
  while (empty != nullptr) {
    Chunk* c = empty;
    chunk_list_remove(empty, c);
    destroy_or_keep_abandoned(c);
  }
}

void chunk_locks_acquire() {
  g_abandoned_lock.lock();
  g_registry_lock.lock();
  g_cache_lock.lock();
}
void chunk_locks_release() {
  g_cache_lock.unlock();
  g_registry_lock.unlock();
  g_abandoned_lock.unlock();
}
LockCounts chunk_registry_lock_counts() { return g_registry_lock.counts(); }
LockCounts chunk_cache_lock_counts() { return g_cache_lock.counts(); }
LockCounts chunk_abandoned_lock_counts() { return g_abandoned_lock.counts(); }
void chunk_locks_reset_in_child() {
  g_cache_lock.reset_after_fork();
  g_registry_lock.reset_after_fork();
  g_abandoned_lock.reset_after_fork();
}

}  // namespace brisk
