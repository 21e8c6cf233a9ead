// The take of an idle heap's partial outgoing batches (threadcache/remote_free.cc), staged
// against an append with the test hooks of remote_free.h. Runs with BRISK_BACKGROUND=0
// (tests/CMakeLists.txt): the test is the only taker.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "threadcache/heap.h"
#include "threadcache/remote_free.h"

namespace {

// The interleaving a review found in the take of batches (fixed by switch_destination's
// compare-and-swap), staged with the test hooks: the freer has read its slot's old destination
// in switch_destination when the taker swaps in its mark and runs its barrier; the freer then
// goes on while the taker waits, before the taker reads out_busy. Had the freer stored its new
// destination over the mark, appended and cleared out_busy, the taker would see a quiet heap and
// send the freer's fresh block to the slot's old destination (a crash when that is null) and
// reset the batch beside the freer's next append. The freer must instead wait for the taker and
// append after it: its block is then the one in its batch, for the right destination.
std::atomic<brisk::Heap*> g_freer{nullptr};
std::atomic<int> g_stage{0};  // 1: the freer is in switch_destination; 2: the taker's barrier ran

bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 4000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

void FreerInSwitch(brisk::Heap* h) {
  int idle = 0;
  if (h != g_freer.load() || !g_stage.compare_exchange_strong(idle, 1)) return;  // once
  WaitFor([] { return g_stage.load() == 2; });
}

void TakerAfterBarrier(brisk::Heap* h) {
  g_stage.store(2);
  // The freer either clears out_busy (to wait for this taker, or, had it overwritten the mark,
  // after its append) or stays busy; either way, at most a few milliseconds.
  WaitFor([h] { return std::atomic_ref<std::uint8_t>(h->out_busy).load() == 0; });
}

TEST(BatchTake, AnAppendThatReadItsSlotBeforeTheTakersMarkWaitsForTheTaker) {
  using namespace brisk;
  // Two owners whose blocks go to different slots of the freer's batches.
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::thread> owners;
  std::vector<std::pair<Heap*, void*>> found;  // an owner's heap and a block of its own
  auto slot_of = [](Heap* d) { return d->id & (kRemoteSlots - 1); };
  while (owners.size() < 16) {
    owners.emplace_back([&] {
      void* p = brisk_malloc(64);
      std::unique_lock<std::mutex> lock(m);
      found.emplace_back(t_heap, p);
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    });
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return found.size() == owners.size(); });
    if (found.size() >= 2 && slot_of(found.back().first) != slot_of(found.front().first)) break;
  }
  int freer_stage = 0;
  std::thread freer;
  // Whatever assertion ends the test, the hooks are cleared and the threads finish and are
  // joined (a joinable thread destroyed would end the whole binary).
  struct Cleanup {
    std::function<void()> run;
    ~Cleanup() { run(); }
  } cleanup{[&] {
    g_switch_destination_test_hook.store(nullptr);
    g_take_outgoing_test_hook.store(nullptr);
    {
      std::unique_lock<std::mutex> lock(m);
      if (freer.joinable()) {
        cv.wait(lock, [&] { return freer_stage >= 1; });
        if (freer_stage == 1) freer_stage = 2;
        cv.notify_all();
        cv.wait(lock, [&] { return freer_stage >= 3; });
        freer_stage = 4;
      }
      release = true;
    }
    cv.notify_all();
    if (freer.joinable()) freer.join();
    for (auto& t : owners) t.join();
    g_freer.store(nullptr);
  }};
  ASSERT_NE(slot_of(found.back().first), slot_of(found.front().first)) << "16 heaps in one slot";
  auto [o1, b1] = found.front();
  auto [o2, b2] = found.back();
  OutgoingBatch* slot1 = nullptr;
  OutgoingBatch* slot2 = nullptr;
  freer = std::thread([&] {
    // A heap of its own, allocating another class than the blocks it frees, which its foreign
    // cache (threadcache/foreign_cache.h) would keep.
    void* own = brisk_malloc(16);
    Heap* h = t_heap;
    slot1 = &h->outgoing[slot_of(o1)];
    slot2 = &h->outgoing[slot_of(o2)];
    brisk_free(b2);  // a partial batch in slot 2: the taker has something to take
    std::unique_lock<std::mutex> lock(m);
    g_freer.store(h);
    freer_stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return freer_stage == 2; });
    lock.unlock();
    brisk_free(b1);  // slot 1 names another heap: switch_destination, paused by the hook
    lock.lock();
    freer_stage = 3;
    cv.notify_all();
    cv.wait(lock, [&] { return freer_stage == 4; });
    lock.unlock();
    brisk_free(own);
  });
  Heap* h;
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return freer_stage == 1; });
    h = g_freer.load();
    ASSERT_EQ(slot2->count, 1u);
    ASSERT_EQ(slot2->dest, o2);
    ASSERT_EQ(slot1->count, 0u);
    // The slot last served another destination (any heap but o1 and o2 would do).
    slot1->dest = &g_orphan_heap;
    g_stage.store(0);
    g_switch_destination_test_hook.store(FreerInSwitch);
    g_take_outgoing_test_hook.store(TakerAfterBarrier);
    freer_stage = 2;
  }
  cv.notify_all();
  ASSERT_TRUE(WaitFor([] { return g_stage.load() == 1; })) << "the freer never reached switch_destination";
  h->slow_lock.lock();  // as the background pass and brisk_trim take it
  std::size_t taken = heap_take_outgoing(h);
  h->slow_lock.unlock();
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return freer_stage >= 3; });
    EXPECT_EQ(g_stage.load(), 2) << "the take never reached its barrier";
    EXPECT_EQ(taken, std::size_t{64}) << "the take sent more or less than slot 2's one block";
    EXPECT_EQ(slot2->count, 0u);
    // The freer's block is in its batch for o1, appended after the take.
    EXPECT_EQ(slot1->dest, o1);
    EXPECT_EQ(slot1->count, 1u) << "the taker sent the freer's block (to the slot's old destination)";
    EXPECT_EQ(slot1->head, static_cast<Block*>(b1));
  }
}

}  // namespace
