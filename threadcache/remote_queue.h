// RemoteQueue: the intrusive multi-producer, single-consumer queue through which blocks freed by
// other threads travel back to the heap that owns their span.
//
// Producers push a whole chain (first..last, already linked through Block::link) with one
// compare-and-swap, so a batch of up to kRemoteBatch blocks costs one atomic operation. The
// consumer takes everything with one exchange. Links live in the freed blocks themselves: the
// remote-free path allocates nothing. Push-only producers plus a take-all consumer have no ABA
// problem (a Treiber stack whose only pop is "take all").
//
// Closing (thread exit) swaps in a sentinel; a push that finds it fails, and the producer sends
// the chain to the orphan queue instead (threadcache/remote_free.cc).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/assert.h"
#include "core/free_key.h"
#include "core/hints.h"

namespace brisk {

class RemoteQueue {
 public:
  // retries, if given, counts the compare-and-swaps that lost to another push or a take.
  bool push(Block* first, Block* last, std::uint64_t* retries = nullptr) {
    std::uintptr_t last_mask = free_code(reinterpret_cast<std::uintptr_t>(last)).link_mask;
    Block* h = head_.load(std::memory_order_relaxed);
    for (;;) {
      if (BRISK_UNLIKELY(h == closed())) return false;
      set_link(last, h, last_mask);
      if (head_.compare_exchange_weak(h, first, std::memory_order_release, std::memory_order_relaxed)) return true;
      if (retries != nullptr) ++*retries;
    }
  }
  bool empty() const {
    Block* h = head_.load(std::memory_order_relaxed);
    return h == nullptr || h == closed();
  }
  Block* take_all() {
    if (empty()) return nullptr;
    Block* h = head_.exchange(nullptr, std::memory_order_acquire);
    // Only the queue's owner takes from it and closes it, so it cannot have closed in between.
    BRISK_ASSERT(h != closed());
    return h;
  }
  // Returns what was queued and refuses further pushes.
  Block* close() {
    Block* h = head_.exchange(closed(), std::memory_order_acquire);
    return h == closed() ? nullptr : h;
  }
  void reopen() { head_.store(nullptr, std::memory_order_release); }

 private:
  static Block* closed() { return reinterpret_cast<Block*>(std::uintptr_t{1}); }
  std::atomic<Block*> head_{nullptr};
};

}  // namespace brisk
