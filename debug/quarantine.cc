#include "debug/quarantine.h"

#include <cstring>

#include "core/assert.h"
#include "core/options.h"
#include "core/platform.h"

namespace brisk::debug {
namespace {

// The calling thread's shard index plus one; 0 until its first push. Shared by all quarantines
// of the process (there is one outside tests), which keeps the TLS to one word.
thread_local unsigned t_shard = 0;

constexpr std::size_t kPrefetchAhead = 4;

}  // namespace

std::size_t Quarantine::default_budget() {
  return static_cast<std::size_t>(options::get(options::Id::kDebugQuarantine));
}

bool Quarantine::init(std::size_t budget_bytes, std::size_t entries_per_shard) {
  BRISK_ASSERT(capacity_ == 0 && entries_per_shard > 0);
  const std::size_t page = 4096;
  const std::size_t ring_bytes = (entries_per_shard * sizeof(QuarantinedBlock) + page - 1) / page * page;
  for (Shard& shard : shards_) {
    shard.ring = static_cast<QuarantinedBlock*>(platform::map(ring_bytes));
    if (shard.ring == nullptr) return false;
    platform::no_huge_pages(shard.ring, ring_bytes);  // a ring touches only what it grows to
  }
  capacity_ = ring_bytes / sizeof(QuarantinedBlock);
  const std::size_t first = page / sizeof(QuarantinedBlock);
  for (Shard& shard : shards_) shard.cap = first < capacity_ ? first : capacity_;
  shard_budget_ = budget_bytes / kShards;
  return true;
}

std::size_t Quarantine::grow(QuarantinedBlock* ring, std::size_t cap, std::size_t& head) const {
  BRISK_ASSERT(cap < capacity_);
  const std::size_t larger = cap * 2 < capacity_ ? cap * 2 : capacity_;
  // Full and wrapped: [head, cap) holds the older blocks, [0, head) the newer ones. The older
  // part moves to the end of the larger ring, so that the newer part follows it there.
  if (head != 0) {
    const std::size_t older = cap - head;
    std::memmove(ring + larger - older, ring + head, older * sizeof(QuarantinedBlock));
    head = larger - older;
  }
  return larger;
}

std::size_t Quarantine::ring_resident_bytes() const {
  const std::size_t ring_bytes = capacity_ * sizeof(QuarantinedBlock);
  std::size_t bytes = 0;
  for (const Shard& shard : shards_)
    if (shard.ring != nullptr) bytes += platform::resident_bytes(shard.ring, ring_bytes);
  return bytes;
}

Quarantine::Shard& Quarantine::my_shard() {
  if (BRISK_UNLIKELY(t_shard == 0)) t_shard = next_shard_.fetch_add(1, std::memory_order_relaxed) % kShards + 1;
  return shards_[t_shard - 1];
}

bool Quarantine::over_budget(std::size_t bytes, std::size_t count) const {
  // The newest block stays even alone over the budget (when there is one), so that a block
  // larger than a shard's budget is quarantined too, until the shard's next push.
  return bytes > shard_budget_ && (count > 1 || shard_budget_ == 0);
}

QuarantinedBlock Quarantine::take_oldest(const QuarantinedBlock* ring, std::size_t capacity, std::size_t& head,
                                         std::size_t& count, std::size_t& bytes) {
  BRISK_ASSERT(count > 0);
  const QuarantinedBlock oldest = ring[head];
  bytes -= oldest.bytes;
  head = head + 1 == capacity ? 0 : head + 1;
  --count;
  return oldest;
}

QuarantinedBlock Quarantine::pop_oldest(Shard& shard) {
  BRISK_ASSERT(shard.lock.is_locked());
  return take_oldest(shard.ring, shard.cap, shard.head, shard.count, shard.bytes);
}

std::size_t Quarantine::push(const QuarantinedBlock* blocks, std::size_t count, QuarantinedBlock* evicted,
                             std::size_t capacity) {
  BRISK_ASSERT(capacity_ > 0 && count >= 1 && capacity >= count);
  Shard& shard = my_shard();
  LockGuard guard(shard.lock);
  ++shard.pushes;
  // The ring's state in locals, stored back once: a store into the ring (a size_t among its
  // fields) may alias the shard's counts, which the compiler would otherwise reload after each.
  QuarantinedBlock* const ring = shard.ring;
  std::size_t cap = shard.cap;
  std::size_t head = shard.head, held = shard.count, bytes = shard.bytes;
  auto pop = [&] { return take_oldest(ring, cap, head, held, bytes); };
  std::size_t n = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (BRISK_UNLIKELY(held == cap)) {
      if (cap < capacity_) cap = grow(ring, cap, head);
      else evicted[n++] = pop();
    }
    std::size_t tail = head + held;  // head and held are below cap: no division
    if (tail >= cap) tail -= cap;
    ring[tail] = blocks[i];
    ++held;
    bytes += blocks[i].bytes;
  }
  while (n < capacity && over_budget(bytes, held)) evicted[n++] = pop();
  // Blocks leave in ring order, about as many per push as it brought once the shard is full,
  // each after it sat here long enough to leave every cache: its header and first bytes were
  // the first miss of a debug free (perf: 27% of MMtest small's time without stacks, in the
  // header's checksum; 10% more time when batches of 16 left unfetched). Fetching the ones
  // that will leave kPrefetchAhead pushes of this size from now gives the fetch that many
  // pushes to arrive.
  for (std::size_t i = kPrefetchAhead * n; i < (kPrefetchAhead + 1) * n && i < held; ++i) {
    std::size_t at = head + i;
    if (at >= cap) at -= cap;
    const char* next = static_cast<const char*>(ring[at].block);
    __builtin_prefetch(next);
    __builtin_prefetch(next + 64);
    __builtin_prefetch(next + 128);
  }
  shard.cap = cap;
  shard.head = head;
  shard.count = held;
  shard.bytes = bytes;
  return n;
}

std::size_t Quarantine::take_excess(QuarantinedBlock* out, std::size_t capacity) {
  Shard& shard = my_shard();
  LockGuard guard(shard.lock);
  std::size_t n = 0;
  while (n < capacity && over_budget(shard.bytes, shard.count)) out[n++] = pop_oldest(shard);
  return n;
}

std::size_t Quarantine::shard_count(unsigned shard) {
  LockGuard guard(shards_[shard].lock);
  return shards_[shard].count;
}

std::size_t Quarantine::pop_up_to(Shard& shard, QuarantinedBlock* out, std::size_t capacity) {
  std::size_t n = 0;
  while (n < capacity && shard.count > 0) out[n++] = pop_oldest(shard);
  return n;
}

std::size_t Quarantine::drain_shard(unsigned shard, QuarantinedBlock* out, std::size_t capacity) {
  LockGuard guard(shards_[shard].lock);
  return pop_up_to(shards_[shard], out, capacity);
}

std::size_t Quarantine::take_idle(QuarantinedBlock* out, std::size_t capacity, std::uint64_t now_ms,
                                  std::uint64_t idle_ms) {
  std::size_t n = 0;
  for (Shard& shard : shards_) {
    LockGuard guard(shard.lock);
    if (shard.pushes != shard.seen_pushes || shard.active_ms == 0) {
      shard.seen_pushes = shard.pushes;
      shard.active_ms = now_ms;
      continue;
    }
    // A caller with an older clock reading than the last one seen (two passes at once) finds
    // nothing idle.
    if (now_ms < shard.active_ms || now_ms - shard.active_ms < idle_ms) continue;
    n += pop_up_to(shard, out + n, capacity - n);
  }
  return n;
}

void Quarantine::for_each(void (*visit)(const QuarantinedBlock& block, void* context), void* context) {
  for (Shard& shard : shards_) {
    LockGuard guard(shard.lock);
    for (std::size_t i = 0, at = shard.head; i < shard.count; ++i, at = at + 1 == shard.cap ? 0 : at + 1)
      visit(shard.ring[at], context);
  }
}

void Quarantine::lock_all() {
  for (Shard& shard : shards_) shard.lock.lock();
}
void Quarantine::unlock_all() {
  for (Shard& shard : shards_) shard.lock.unlock();
}
void Quarantine::reset_locks_in_child() {
  for (Shard& shard : shards_) shard.lock.reset_after_fork();
}

Quarantine::Totals Quarantine::totals() {
  Totals sum{0, 0};
  for (Shard& shard : shards_) {
    LockGuard guard(shard.lock);
    sum.bytes += shard.bytes;
    sum.count += shard.count;
  }
  return sum;
}

}  // namespace brisk::debug
