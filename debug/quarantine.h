// Quarantine: freed debug blocks wait here, first in first out, before their memory is reused,
// so that a write after free has time to damage the freed pattern and be seen.
//
// Interface for the debug layer's integration:
//   init(budget, entries_per_shard)     maps the shards' rings from core/platform. The budget
//                                       (BRISK_DEBUG_QUARANTINE: default_budget()) is split
//                                       evenly between kShards shards.
//   push(blocks, n, evicted, cap)       puts n freed blocks, oldest first, in the calling
//                                       thread's shard under one lock, and takes out that shard's
//                                       oldest blocks, into evicted (oldest first, up to cap >= n):
//                                       one for each block pushed while its ring was full at its
//                                       largest (entries_per_shard; it grows to that), then
//                                       while it holds more than its budget, but never the block
//                                       pushed last: a block larger than the shard's budget stays,
//                                       alone, until the shard's next push (budget 0: the
//                                       quarantine is off, every block comes straight back). The
//                                       caller checks each evicted block's freed pattern and
//                                       really frees it. push(block, bytes, ...): one block.
//   take_excess(out, cap)               the rest, when push's cap was too small.
//   shard_count(i) / drain_shard(i, ...) the blocks in shard i now; takes up to cap of them out,
//                                       oldest first (brisk_trim takes what each held when it
//                                       began, so threads that go on freeing cannot keep it going).
//   take_idle(out, cap, now, idle)      the same for each shard idle at now: no block pushed to
//                                       it between two calls at least idle ms apart (the push
//                                       count compared, so that a push reads no clock). The
//                                       background pass's: a thread that stopped freeing would
//                                       keep its last blocks here, and they the spans they lie in.
//   for_each(visit, context)            visits every quarantined block (brisk_check_heap), each
//                                       shard under its lock.
//   lock_all / unlock_all /             fork: every shard's lock, in shard order; released in
//   reset_locks_in_child                the parent, reset in the child.
//
// Order is FIFO within a shard; a thread keeps its shard, so each thread's frees leave in the
// order it made them. Threads share no lock on a free unless they share a shard (threads are
// spread round-robin over kShards shards). `bytes` passed in is what counts against the budget.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/hints.h"
#include "core/lock.h"

namespace brisk::debug {

struct QuarantinedBlock {
  void* block;
  std::size_t bytes;
};

class Quarantine {
 public:
  static constexpr unsigned kShards = 8;

  // BRISK_DEBUG_QUARANTINE, read through core/options.
  static std::size_t default_budget();

  bool init(std::size_t budget_bytes, std::size_t entries_per_shard);
  std::size_t push(const QuarantinedBlock* blocks, std::size_t n, QuarantinedBlock* evicted, std::size_t capacity);
  std::size_t push(void* block, std::size_t bytes, QuarantinedBlock* evicted, std::size_t capacity) {
    const QuarantinedBlock one{block, bytes};
    return push(&one, 1, evicted, capacity);
  }
  std::size_t take_excess(QuarantinedBlock* out, std::size_t capacity);
  std::size_t shard_count(unsigned shard);
  std::size_t drain_shard(unsigned shard, QuarantinedBlock* out, std::size_t capacity);
  std::size_t take_idle(QuarantinedBlock* out, std::size_t capacity, std::uint64_t now_ms, std::uint64_t idle_ms);
  void for_each(void (*visit)(const QuarantinedBlock& block, void* context), void* context);
  void lock_all();
  void unlock_all();
  void reset_locks_in_child();

  // Totals over the shards (each read under its lock, so exact when no thread pushes).
  struct Totals {
    std::size_t bytes;
    std::size_t count;
  };
  Totals totals();
  std::size_t bytes() { return totals().bytes; }
  std::size_t count() { return totals().count; }
  std::size_t shard_budget() const { return shard_budget_; }
  // The resident bytes of the shards' rings (mincore): what the quarantine's own bookkeeping
  // holds of the process's memory.
  std::size_t ring_resident_bytes() const;

 private:
  struct alignas(BRISK_CACHELINE) Shard {
    SpinLock lock;
    // The first `cap` entries of a mapping of capacity_; the oldest at head. cap starts at a
    // page's worth and doubles when the ring is full, up to capacity_. Blocks going round a ring
    // of all capacity_ entries (65,536, 1 MiB) would make all of it resident in time, 8 MiB for
    // the 8 shards (a third of sh6bench's peak in debug mode), where the budget lets a shard
    // hold a few thousand blocks (3,300 of 64 bytes by default).
    QuarantinedBlock* ring = nullptr;
    std::size_t cap = 0;
    std::size_t head = 0;
    std::size_t count = 0;
    std::size_t bytes = 0;
    std::uint64_t pushes = 0;         // push calls so far
    std::uint64_t seen_pushes = 0;    // take_idle's: pushes at its last look,
    std::uint64_t active_ms = 0;      // and when it last saw them move (0: not yet looked)
  };
  Shard& my_shard();
  // The oldest block of a ring of capacity entries whose state is head, count and bytes (a
  // shard's, or push's copy of it), taken out; the ring is not empty.
  static QuarantinedBlock take_oldest(const QuarantinedBlock* ring, std::size_t capacity, std::size_t& head,
                                      std::size_t& count, std::size_t& bytes);
  // A full ring of cap entries (below capacity_) made larger, its blocks kept in order: the new
  // cap. head moves when the ring wraps (its older part goes to the end of the larger ring).
  std::size_t grow(QuarantinedBlock* ring, std::size_t cap, std::size_t& head) const;
  // The shard's oldest block, taken out. The shard's lock is held and it is not empty.
  QuarantinedBlock pop_oldest(Shard& shard);
  // Up to capacity of the shard's blocks, oldest first, into out; the shard's lock is held.
  std::size_t pop_up_to(Shard& shard, QuarantinedBlock* out, std::size_t capacity);
  // Whether push and take_excess take another block out of a shard holding count blocks of
  // bytes in all (its lock held).
  bool over_budget(std::size_t bytes, std::size_t count) const;

  Shard shards_[kShards];
  std::size_t capacity_ = 0;  // ring entries per shard
  std::size_t shard_budget_ = 0;
  std::atomic<unsigned> next_shard_{0};
};

}  // namespace brisk::debug
