// Parked heaps (threadcache/heap_lifecycle.cc): while a thread waits in pthread_join its heap is
// parked, and a thread that frees its blocks once it has been parked kParkedTakeAfterMs takes
// what the heap holds, adopting the blocks' spans. brisk_core does not replace pthread_join, so
// these tests park and unpark around a join as override/threads.cc's pthread_join does, with a
// fake clock. BRISK_BACKGROUND=0 and BRISK_IDLE_MS=100 (tests/CMakeLists.txt): only these
// threads, and the background passes they run, take a heap.
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"
#include "tests/test_util.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"

namespace {

std::atomic<std::uint64_t> g_fake_now{1'000'000};
std::uint64_t FakeClock() { return g_fake_now.load(); }

class ParkedHeap : public ::testing::Test {
 protected:
  void SetUp() override { brisk::platform::set_clock_for_test(FakeClock); }
  void TearDown() override {
    brisk::platform::set_clock_for_test(nullptr);
    brisk::g_take_parked_test_hook.store(nullptr);
  }
};

const brisk::Span* SpanOf(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return brisk::chunk_of(a)->span_of(a);
}

constexpr std::size_t kSize = 200;

// A thread that frees the blocks once their heap has been parked for the take time: its first
// free may take the heap.
std::thread FreeOnceTakeable(const std::vector<void*>& blocks) {
  return std::thread([&blocks] {
    g_fake_now += brisk::kParkedTakeAfterMs;
    for (void* p : blocks) brisk_free(p);
  });
}
constexpr int kCount = 4096;

std::vector<void*> AllocateFilled(int count, unsigned char fill) {
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    void* p = brisk_malloc(kSize);
    if (p == nullptr) break;
    std::memset(p, fill, kSize);
    blocks.push_back(p);
  }
  return blocks;
}

bool Filled(const void* p, unsigned char fill) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < kSize; ++i)
    if (b[i] != fill) return false;
  return true;
}

// The main pattern: a thread allocates, starts a thread that frees those blocks and allocates
// its own, and joins it. Before parked heaps the frees waited in the joining thread's queue
// and the other thread's blocks came from fresh spans.
TEST_F(ParkedHeap, TheThreadThatFreesAJoiningThreadsBlocksReusesTheirSpans) {
  std::vector<void*> mine = AllocateFilled(kCount, 0x11);
  ASSERT_EQ(mine.size(), static_cast<std::size_t>(kCount));
  std::set<const brisk::Span*> my_spans;
  for (void* p : mine) my_spans.insert(SpanOf(p));
  const std::uint64_t taken = brisk::heaps_taken_parked();

  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  EXPECT_EQ(brisk::t_heap, &brisk::g_exited_heap);
  std::vector<void*> theirs;
  int reused = 0;
  bool intact = true;
  std::thread worker([&] {
    g_fake_now += brisk::kParkedTakeAfterMs;
    for (void* p : mine) {
      intact &= Filled(p, 0x11);
      brisk_free(p);
    }
    theirs = AllocateFilled(kCount, 0x22);
    for (void* p : theirs) reused += my_spans.count(SpanOf(p)) != 0 ? 1 : 0;
  });
  worker.join();
  brisk::heap_unpark(parked);
  EXPECT_EQ(brisk::t_heap, parked);

  EXPECT_TRUE(intact);
  EXPECT_EQ(brisk::heaps_taken_parked(), taken + 1);
  ASSERT_EQ(theirs.size(), static_cast<std::size_t>(kCount));
  // The spans of the joining thread's blocks became the freeing thread's, which allocated into
  // them again before it took fresh memory (without the take: none of them).
  EXPECT_GE(reused, kCount * 3 / 4) << "of " << kCount << " blocks allocated after the frees";

  // The joining thread goes on with its emptied heap: new blocks, and frees of the other's.
  std::vector<void*> again = AllocateFilled(kCount, 0x33);
  EXPECT_EQ(again.size(), static_cast<std::size_t>(kCount));
  for (void* p : theirs) {
    EXPECT_TRUE(Filled(p, 0x22));
    brisk_free(p);
  }
  for (void* p : again) {
    EXPECT_TRUE(Filled(p, 0x33));
    brisk_free(p);
  }
}

// A join that returns before kParkedTakeAfterMs costs the heap nothing: the frees are queued.
TEST_F(ParkedHeap, AHeapParkedForLessThanTheTakeTimeIsKept) {
  std::vector<void*> mine = AllocateFilled(64, 0x44);
  const std::uint64_t taken = brisk::heaps_taken_parked();
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  std::thread worker([&] {
    g_fake_now += brisk::kParkedTakeAfterMs - 1;
    for (void* p : mine) brisk_free(p);
    brisk_thread_collect();  // sends its batches: to the parked heap's queue
  });
  worker.join();
  EXPECT_EQ(brisk::heaps_taken_parked(), taken);
  EXPECT_FALSE(parked->incoming.empty());
  brisk::heap_unpark(parked);
  EXPECT_EQ(brisk::t_heap, parked);
  brisk_thread_collect();  // takes the queued frees
  EXPECT_TRUE(parked->incoming.empty());
}

// With no thread freeing its blocks, a heap parked for BRISK_IDLE_MS is taken by the
// background pass: its spans go to the central pools, for any
// thread to allocate from.
TEST_F(ParkedHeap, TheBackgroundPassTakesAHeapParkedForTheIdleTime) {
  std::vector<void*> mine = AllocateFilled(64, 0x48);
  const std::uint64_t taken = brisk::heaps_taken_parked();
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  const auto idle = static_cast<std::uint64_t>(brisk::options::get(brisk::options::Id::kIdleMs));
  g_fake_now += idle / 2;
  brisk::background_pass(FakeClock());
  EXPECT_EQ(brisk::heaps_taken_parked(), taken);
  EXPECT_EQ(SpanOf(mine[0])->owner.load(), parked);
  g_fake_now += idle - idle / 2;
  brisk::background_pass(FakeClock());
  EXPECT_EQ(brisk::heaps_taken_parked(), taken + 1);
  EXPECT_EQ(SpanOf(mine[0])->owner.load(), &brisk::g_orphan_heap);
  brisk::heap_unpark(parked);
  for (void* p : mine) {
    EXPECT_TRUE(Filled(p, 0x48));
    brisk_free(p);  // adopts the spans back
  }
  EXPECT_EQ(SpanOf(mine[0])->owner.load(), parked);
}

// A free takes a parked heap only if it owns at most kParkedTakeInFreeMaxSpans spans: the take
// runs in that free, and this bounds its stall. A bigger one is left to the background pass.
TEST_F(ParkedHeap, AFreeDoesNotTakeAHeapOfMoreSpansThanItsBound) {
  constexpr std::size_t kOneBlockSpan = 40000;  // a small class whose span holds one block
  std::vector<void*> mine;
  for (std::uint32_t i = 0; i < brisk::kParkedTakeInFreeMaxSpans + 64; ++i) {
    auto* p = static_cast<char*>(brisk_malloc(kOneBlockSpan));
    ASSERT_NE(p, nullptr);
    p[0] = 1;
    mine.push_back(p);
  }
  const std::uint64_t taken = brisk::heaps_taken_parked();
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  EXPECT_GT(brisk::load_shared(parked->span_count), brisk::kParkedTakeInFreeMaxSpans);
  std::thread worker([&] {
    g_fake_now += brisk::kParkedTakeAfterMs;
    brisk_free(mine.back());
  });
  worker.join();
  EXPECT_EQ(brisk::heaps_taken_parked(), taken);
  g_fake_now += static_cast<std::uint64_t>(brisk::options::get(brisk::options::Id::kIdleMs));
  brisk::background_pass(FakeClock());
  EXPECT_EQ(brisk::heaps_taken_parked(), taken + 1);
  EXPECT_EQ(brisk::load_shared(parked->span_count), 0u);
  brisk::heap_unpark(parked);
  mine.pop_back();
  for (void* p : mine) brisk_free(p);
}

// Unparking waits for a take under way: the thread's fast paths never run beside it.
std::atomic<bool> g_in_take{false};
std::atomic<bool> g_unparking{false};
std::atomic<bool> g_take_finished{false};
void HoldTheTake(brisk::Heap*) {
  g_in_take.store(true);
  brisk_test::WaitUntil([] { return g_unparking.load(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  g_take_finished.store(true);
}

TEST_F(ParkedHeap, UnparkingWaitsForATakeUnderWay) {
  std::vector<void*> mine = AllocateFilled(16, 0x55);
  brisk::g_take_parked_test_hook.store(HoldTheTake);
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  std::thread worker = FreeOnceTakeable(mine);
  brisk_test::WaitUntil([] { return g_in_take.load(); });
  g_unparking.store(true);
  brisk::heap_unpark(parked);
  EXPECT_TRUE(g_take_finished.load());
  worker.join();
  void* p = brisk_malloc(kSize);
  ASSERT_NE(p, nullptr);
  brisk_free(p);
}

// A signal handler that allocates while its thread is parked (and its heap taken meanwhile)
// does so as an exited thread would, through a borrowed heap, never on the parked heap.
std::atomic<int> g_handled{0};
std::atomic<int> g_handler_failures{0};
void AllocateInHandler(int) {
  if (brisk::t_heap != &brisk::g_exited_heap) g_handler_failures.fetch_add(1);
  void* p = brisk_malloc(kSize);
  if (p == nullptr) {
    g_handler_failures.fetch_add(1);
  } else {
    std::memset(p, 0x66, kSize);
    if (!Filled(p, 0x66)) g_handler_failures.fetch_add(1);
    brisk_free(p);
  }
  g_handled.fetch_add(1);
}

TEST_F(ParkedHeap, ASignalHandlerOfAParkedThreadLeavesItsHeapAlone) {
  struct sigaction sa = {};
  struct sigaction old = {};
  sa.sa_handler = AllocateInHandler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  std::vector<void*> mine = AllocateFilled(kCount, 0x77);
  const std::uint64_t taken = brisk::heaps_taken_parked();
  const pthread_t self = pthread_self();
  constexpr int kSignals = 20;
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  std::thread worker([&] {
    g_fake_now += brisk::kParkedTakeAfterMs;
    int sent = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      brisk_free(mine[i]);
      if (i % (mine.size() / kSignals) == 0 && sent < kSignals) {
        pthread_kill(self, SIGUSR1);
        ++sent;
        // Standard signals do not queue: each is handled before the next is sent.
        brisk_test::WaitUntil([&] { return g_handled.load() >= sent; });
      }
    }
  });
  worker.join();
  brisk::heap_unpark(parked);
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(g_handled.load(), kSignals);
  EXPECT_EQ(g_handler_failures.load(), 0);
  EXPECT_EQ(brisk::heaps_taken_parked(), taken + 1);
}

// A thread that leaves while parked (cancelled in pthread_join, or pthread_exit from a signal
// handler there) never unparks itself: its key destructor does, and gives the heap back.
TEST_F(ParkedHeap, AThreadThatExitsWhileParkedGivesItsHeapBack) {
  const std::uint64_t live = brisk::stats::g.heaps_live.load();
  std::atomic<brisk::Heap*> heap{nullptr};
  void* kept = nullptr;
  pthread_t t;
  auto body = [](void* arg) -> void* {
    auto* out = static_cast<std::pair<std::atomic<brisk::Heap*>*, void**>*>(arg);
    *out->second = brisk_malloc(kSize);
    std::memset(*out->second, 0x5a, kSize);
    out->first->store(brisk::heap_park());
    pthread_exit(nullptr);
  };
  std::pair<std::atomic<brisk::Heap*>*, void**> arg{&heap, &kept};
  ASSERT_EQ(pthread_create(&t, nullptr, body, &arg), 0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);
  ASSERT_NE(heap.load(), nullptr);
  EXPECT_EQ(heap.load()->parked.load(), brisk::kHeapRunning);
  EXPECT_EQ(heap.load()->thread_id.load(), 0u);  // back in the pool
  EXPECT_EQ(brisk::stats::g.heaps_live.load(), live);
  ASSERT_NE(kept, nullptr);
  EXPECT_TRUE(Filled(kept, 0x5a));
  brisk_free(kept);
}

// A thread that leaves while parked without its key destructor (the exit system call from a
// signal handler that interrupted pthread_join) leaves its heap parked; the sweep for gone
// threads' heaps gives it to the pool. Its mark must not go with it: the heap's next thread
// would have it taken from under its fast paths (a review's probe: TSan reported the take's
// writes racing with the new owner's).
std::atomic<brisk::Heap*> g_raw_exit_heap{nullptr};
void* ParkAndExitRaw(void*) {
  void* p = brisk_malloc(kSize);
  std::memset(p, 0x21, kSize);
  g_raw_exit_heap.store(brisk::heap_park());
  syscall(SYS_exit, 0);
  return nullptr;
}

TEST_F(ParkedHeap, AHeapReapedWhileParkedIsNotTakenUnderItsNextThread) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' runtimes do not survive a thread's raw exit";
#endif
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, ParkAndExitRaw, nullptr), 0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);  // the kernel clears the thread id glibc waits on
  brisk::Heap* gone = g_raw_exit_heap.load();
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(gone->parked.load(), brisk::kHeapParked);
  EXPECT_GE(brisk::heap_reap_exited(), 1u);
  EXPECT_EQ(gone->parked.load(), brisk::kHeapRunning);
  // The pool gives the heap out again, last in first out: to this new thread.
  const std::uint64_t taken = brisk::heaps_taken_parked();
  std::atomic<bool> done{false};
  std::atomic<brisk::Heap*> theirs{nullptr};
  std::vector<void*> blocks;
  std::thread next([&] {
    blocks = AllocateFilled(256, 0x23);
    theirs.store(brisk::t_heap);
    brisk_test::WaitUntil([&] { return done.load(); });
  });
  brisk_test::WaitUntil([&] { return theirs.load() != nullptr; });
  EXPECT_EQ(theirs.load(), gone);
  g_fake_now += 1000;
  for (void* p : blocks) brisk_free(p);  // frees of a running thread's blocks: no take
  EXPECT_EQ(brisk::heaps_taken_parked(), taken);
  done.store(true);
  next.join();
}

// A take resets the heap for its thread to go on with, not the thread's counters.
TEST_F(ParkedHeap, ATakeKeepsTheThreadsCounters) {
  std::vector<void*> theirs;
  std::atomic<bool> allocated{false}, freed{false};
  std::thread other([&] {  // alive while its blocks are freed: they are remote frees
    theirs = AllocateFilled(200, 0x31);
    allocated.store(true);
    brisk_test::WaitUntil([&] { return freed.load(); });
  });
  brisk_test::WaitUntil([&] { return allocated.load(); });
  std::vector<void*> mine = AllocateFilled(64, 0x32);
  for (void* p : theirs) brisk_free(p);
  brisk_thread_collect();  // sends the batches: counted as sent
  freed.store(true);
  other.join();
  const std::uint64_t sent = brisk::t_heap->remote_frees_sent.load();
  EXPECT_GE(sent, 200u);
  const std::uint64_t taken = brisk::heaps_taken_parked();
  brisk::Heap* parked = brisk::heap_park();
  std::thread worker = FreeOnceTakeable(mine);
  worker.join();
  brisk::heap_unpark(parked);
  EXPECT_EQ(brisk::heaps_taken_parked(), taken + 1);
  EXPECT_EQ(parked->remote_frees_sent.load(), sent);
}

// A signal handler that forks while its thread is parked and another thread's take of its heap
// holds the heap's lock: fork's prepare handler takes that lock as the forking thread's own,
// waiting for the take, so that the child, which goes on from the fork and unparks, finds it
// free. Before, the child spun for ever on a lock held by the taker, gone in the child (a
// review's probe). The signal is raised by the parked thread itself, at a known point; unpark
// holds signals off, so none is handled inside it.
std::atomic<bool> g_long_take{false};
void HoldTheTakeLong(brisk::Heap*) {
  g_long_take.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}
pid_t g_fork_child = -1;
void ForkInHandler(int) { g_fork_child = fork(); }

TEST_F(ParkedHeap, AForkFromASignalHandlerWhileParkedDuringATakeLeavesTheChildAHeap) {
  struct sigaction sa = {};
  struct sigaction old = {};
  sa.sa_handler = ForkInHandler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
  const pid_t parent = getpid();
  std::vector<void*> mine = AllocateFilled(64, 0x41);
  brisk::g_take_parked_test_hook.store(HoldTheTakeLong);
  brisk::Heap* parked = brisk::heap_park();
  ASSERT_NE(parked, nullptr);
  std::thread worker = FreeOnceTakeable(mine);
  brisk_test::WaitUntil([] { return g_long_take.load(); });
  raise(SIGUSR2);  // handled here: the fork waits in prepare for the take to end
  brisk::heap_unpark(parked);
  if (getpid() != parent) {  // the child
    void* p = brisk_malloc(kSize);
    if (p != nullptr) std::memset(p, 0x42, kSize);
    brisk_free(p);
    // exit_group directly: the sanitizers' exit path would report the parent's threads, copied
    // into the child's bookkeeping but not into the child, as leaked.
    syscall(SYS_exit_group, p != nullptr && brisk::t_heap == parked ? 0 : 3);
  }
  worker.join();
  sigaction(SIGUSR2, &old, nullptr);
  ASSERT_GT(g_fork_child, 0);
  int status = 0;
  ASSERT_TRUE(brisk_test::WaitForChild(g_fork_child, 10, &status)) << "the child hung";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
