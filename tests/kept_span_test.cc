// Kept empty spans (threadcache/orphans.h): an emptied small span that its heap does not keep
// goes whole to its class's central pool, serves the class's next span there, and goes back to
// its chunk after the purge delay, at a collect or a trim, or at once past the pools' budget.
// Run with BRISK_BACKGROUND=0 (no pass of brisk's own thread meanwhile; the tests make theirs
// on a fake clock), and once more with BRISK_KEPT_SPAN_BYTES=256k for the budget.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/size_class.h"
#include "tests/test_util.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"
#include "threadcache/orphans.h"

namespace brisk {
namespace {

// A one-page class of one block a span above 32 KiB (40 KiB blocks), and another one-page class.
constexpr std::size_t kSize = 40 * 1024;
constexpr std::size_t kOtherSize = 36 * 1024;

Span* span_of(void* p) { return chunk_of(reinterpret_cast<std::uintptr_t>(p))->span_of(reinterpret_cast<std::uintptr_t>(p)); }

// The span of a kSize block a thread allocated and freed before it exited: its class's emptied
// current span, which the exit hands to the class's pool.
Span* SpanLeftByAnExitedThread() {
  Span* s = nullptr;
  std::thread([&] {
    void* p = brisk_malloc(kSize);
    std::memset(p, 0x5a, kSize);
    s = span_of(p);
    brisk_free(p);
  }).join();
  return s;
}

// A thread allocates n kSize blocks and one of another class (so that kSize's is not the class
// it refilled last), frees them all and exits: its emptied kSize spans but the spare are kept.
void EmptySpansOfAnExitedThread(int n) {
  std::thread([n] {
    std::vector<void*> blocks;
    for (int i = 0; i < n; ++i) blocks.push_back(brisk_malloc(kSize));  // one becomes the spare
    void* other = brisk_malloc(kOtherSize);
    for (void* p : blocks) brisk_free(p);
    brisk_free(other);
  }).join();
}

std::atomic<std::uint64_t> g_now{5'000'000};
std::uint64_t FakeClock() { return g_now.load(); }

class KeptSpans : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (kept_span_test)";
    platform::set_clock_for_test(FakeClock);
    brisk_thread_collect();  // no span an earlier test left kept
    ASSERT_EQ(CentralPool::g_kept_span_bytes.load(), 0u);
  }
  void TearDown() override {
    brisk_thread_collect();
    platform::set_clock_for_test(nullptr);
  }
  static std::size_t KeptBytes() {
    brisk_stats s;
    brisk_get_stats(&s);
    return s.kept_span_bytes;
  }
  static std::uint64_t Delay() { return static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs)); }
};

// A thread that exits with its span of the class empty (installed, as an emptied current span
// stays) hands it to the class's pool whole, uncarved; the next thread short of the class takes
// it and carves it from its first block again, while a span of another class does not take its
// page (before kept spans, the exit gave the page back to the chunk, where the next new span of
// any class took it, resident pages first).
TEST_F(KeptSpans, AnExitedThreadsEmptySpanServesTheNextThreadsBlockOfItsClassOnly) {
  ASSERT_NE(size_to_class(kSize), size_to_class(kOtherSize));
  ASSERT_EQ(kClasses[size_to_class(kSize)].span_pages, 1u);
  Span* kept = SpanLeftByAnExitedThread();
  char* start = kept->start;  // a span's start stays while it holds its pages
  EXPECT_TRUE(kept->kept) << "the exit gave the span's pages back";
  EXPECT_EQ(kept->owner.load(), &g_orphan_heap);
  EXPECT_EQ(kept->carved_blocks, 0u);
  EXPECT_EQ(kept->kind, SpanKind::kSmall);
  EXPECT_EQ(KeptBytes(), round_to_os_page(kClasses[size_to_class(kSize)].size));
  std::thread([&] {
    void* other = brisk_malloc(kOtherSize);
    ASSERT_NE(other, nullptr);
    EXPECT_NE(span_of(other), kept) << "a span of another class took the kept span's page";
    void* p = brisk_malloc(kSize);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(span_of(p), kept);
    EXPECT_EQ(static_cast<char*>(p), start) << "carved again from its first block";
    EXPECT_FALSE(kept->kept);
    EXPECT_EQ(kept->owner.load(), t_heap);
    std::memset(p, 0x33, kSize);
    brisk_free(p);
    brisk_free(other);
  }).join();
}

// A thread's own free that empties a span of a one-page class, not the class's current span,
// makes it the class's spare (on the heap's list, for the class's next block); the next such
// span, the spare taken, goes to the class's pool, kept whole: not while the class is the one
// the thread refilled last. A kept span's blocks, never handed out since, are free: a second
// free of one is reported as a double free, not taken into the pool's span.
TEST_F(KeptSpans, AFreeThatEmptiesASpanPastTheSpareKeepsItCentrally) {
  std::thread([&] {
    void* blocks[3];
    for (void*& p : blocks) p = brisk_malloc(kSize);  // three spans; the last is the current one
    void* other = brisk_malloc(kOtherSize);             // the class refilled last is another
    const unsigned c = size_to_class(kSize);
    brisk_free(blocks[0]);
    EXPECT_EQ(t_heap->spare[c], span_of(blocks[0]));
    EXPECT_FALSE(span_of(blocks[0])->kept);
    Span* s = span_of(blocks[1]);
    brisk_free(blocks[1]);
    EXPECT_TRUE(s->kept);
    EXPECT_EQ(s->owner.load(), &g_orphan_heap);
    brisk_free(blocks[2]);
    EXPECT_FALSE(span_of(blocks[2])->kept) << "the current span stays its heap's";
    brisk_free(other);
  }).join();
}

TEST(KeptSpansDeathTest, ASecondFreeOfABlockOfAKeptSpanIsReported) {
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        void* blocks[3];
        for (void*& p : blocks) p = brisk_malloc(kSize);
        void* other = brisk_malloc(kOtherSize);
        brisk_free(blocks[0]);  // the spare
        brisk_free(blocks[1]);  // kept
        if (span_of(blocks[1])->kept) brisk_free(blocks[1]);
        brisk_free(blocks[2]);
        brisk_free(other);
        abort();  // not kept, or the second free went unseen: the same death, another message
      },
      "double free of");
}

// A thread cycling through spans of the class it refills (each new block of a one-block class
// made while the last is live, then the last freed: realloc's move) gives each emptied span
// back rather than keeping it: the span it will need next is the one its next block gets.
TEST_F(KeptSpans, ASpanEmptiedInTheClassRefilledLastIsNotKept) {
  std::thread([&] {
    void* p = brisk_malloc(kSize);
    for (int i = 0; i < 16; ++i) {
      void* q = brisk_malloc(kSize);
      ASSERT_NE(span_of(q), span_of(p));
      std::memcpy(q, p, 64);
      brisk_free(p);
      p = q;
    }
    EXPECT_EQ(KeptBytes(), 0u);
    brisk_free(p);
  }).join();
}

// Past the purge delay a kept span goes back to its chunk: at the next keep of its class, at any
// heap's purge check (once per delay process-wide) and at the background pass.
TEST_F(KeptSpans, AKeptSpanGoesBackToItsChunkAfterThePurgeDelay) {
  Span* s = SpanLeftByAnExitedThread();
  ASSERT_TRUE(s->kept);
  Chunk* chunk = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
  const unsigned page = s->first_page;
  g_now += Delay() / 2;
  release_stale_kept_spans_due(g_now.load(), Delay());
  background_pass(g_now.load());
  EXPECT_TRUE(s->kept) << "gone before the delay";
  g_now += Delay();
  background_pass(g_now.load());
  EXPECT_FALSE(s->kept);
  EXPECT_EQ(KeptBytes(), 0u);
  EXPECT_EQ(chunk->page_span[page], &chunk->spans[0]) << "its page is free in its chunk";

  // The same through a purge check's sweep.
  s = SpanLeftByAnExitedThread();
  ASSERT_TRUE(s->kept);
  g_now += Delay();
  release_stale_kept_spans_due(g_now.load(), Delay());
  EXPECT_FALSE(s->kept);
  EXPECT_EQ(KeptBytes(), 0u);
}

// A sweep whose clock was read before a span was kept (the background pass reads it before its
// parked-heap takes, which keep spans) leaves that span: it is fresh, not ages old.
TEST_F(KeptSpans, ASweepWithAnEarlierClockLeavesASpanKeptAfterIt) {
  const std::uint64_t before = g_now.load();
  g_now += 1;
  Span* s = SpanLeftByAnExitedThread();
  ASSERT_TRUE(s->kept);
  release_kept_spans(before, Delay());
  EXPECT_TRUE(s->kept) << "a span kept 1 ms after the sweep's clock went as stale";
}

// brisk_trim gives back every kept span's pages, whatever their age. (Their chunks may be
// unmapped then, descriptors and all: only the counts are read after it.)
TEST_F(KeptSpans, TrimGivesBackEveryKeptSpan) {
  brisk_stats before;
  brisk_get_stats(&before);
  EmptySpansOfAnExitedThread(9);
  ASSERT_GE(KeptBytes(), 7 * round_to_os_page(kClasses[size_to_class(kSize)].size));
  brisk_trim();
  brisk_stats after;
  brisk_get_stats(&after);
  EXPECT_EQ(after.kept_span_bytes, 0u);
  EXPECT_EQ(after.spans_orphaned, before.spans_orphaned);
  EXPECT_EQ(after.central_pool_bytes, before.central_pool_bytes);
}

// A switch to a strategy whose budget the kept spans exceed gives them back at once: a process
// whose threads have all stopped runs no purge check that would (before, 16 MiB kept by speed
// mode stayed after a switch to low-memory, which keeps none: a review's probe).
TEST_F(KeptSpans, ASwitchToAStrategyThatKeepsLessGivesTheSpansBack) {
  struct Restore {
    ~Restore() { brisk_set_strategy(BRISK_STRATEGY_BALANCED); }
  } restore;
  EmptySpansOfAnExitedThread(4);
  const std::uint64_t kept = KeptBytes();
  ASSERT_GE(kept, 2 * round_to_os_page(kClasses[size_to_class(kSize)].size));
  ASSERT_EQ(brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY), 0);
  const auto budget = static_cast<std::uint64_t>(options::get(options::Id::kKeptSpanBytes));
  if (budget >= kept) {
    EXPECT_EQ(KeptBytes(), kept) << "within the new budget (kept_span_budget_test's 256k): they stay";
  } else {
    EXPECT_EQ(KeptBytes(), 0u) << "kept spans past the new strategy's budget of " << budget;
  }
}

// A fork while another thread gives kept spans back (taken off their pool's list, their pages
// not yet back in their chunk) waits for that release: the child finds the spans' pages free in
// their chunks. Had it gone ahead, no list would hold those spans in the child, and the thread
// releasing them is not there: their pages lost to it.
std::atomic<bool> g_release_paused{false};
void PauseOnceInARelease(Span*) {
  if (!g_release_paused.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

TEST_F(KeptSpans, AForkWhileKeptSpansGoBackLosesNoneOfThemInTheChild) {
  struct Restore {
    ~Restore() {
      g_kept_release_test_hook.store(nullptr);
      brisk_set_strategy(BRISK_STRATEGY_BALANCED);
    }
  } restore;
  std::vector<Span*> spans;
  void* live = nullptr;  // keeps the spans' chunk in use, so that the child may read it
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(brisk_malloc(kSize));
    live = brisk_malloc(kOtherSize);  // the class refilled last is another
    for (void* p : blocks) spans.push_back(span_of(p));
    for (void* p : blocks) brisk_free(p);
  }).join();
  std::vector<Span*> kept;
  for (Span* s : spans)
    if (s->kept) kept.push_back(s);
  ASSERT_GE(kept.size(), 2u);
  for (Span* s : kept) ASSERT_EQ(chunk_of(reinterpret_cast<std::uintptr_t>(s->start)), chunk_of(reinterpret_cast<std::uintptr_t>(live)));
  std::vector<unsigned> pages;
  for (Span* s : kept) pages.push_back(s->first_page);
  Chunk* chunk = chunk_of(reinterpret_cast<std::uintptr_t>(live));

  g_release_paused.store(false);
  g_kept_release_test_hook.store(PauseOnceInARelease);
  std::thread releaser([] { brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY); });  // keeps none
  while (!g_release_paused.load()) std::this_thread::yield();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int lost = 0;
    for (unsigned page : pages) lost += chunk->page_span[page] != &chunk->spans[0];
    _exit(lost);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  releaser.join();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "kept spans of " << kept.size() << " on no list in the child";
  for (unsigned page : pages) EXPECT_EQ(chunk->page_span[page], &chunk->spans[0]) << "in the parent";
  brisk_free(live);
}

// A signal handler that forks on the thread releasing a chain of kept spans: the fork must not
// wait for that release, which cannot end until the handler returns (it did, for ever, before
// the releasing thread was told apart). The child runs and exits; the release ends after.
std::atomic<int> g_handler_fork_status{-1};
void ForkInHandler(int) {
  const pid_t pid = fork();
  if (pid == 0) _exit(7);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) g_handler_fork_status = WEXITSTATUS(status);
}
std::atomic<bool> g_raised{false};
void RaiseOnceInARelease(Span*) {
  if (!g_raised.exchange(true)) raise(SIGUSR1);
}

TEST_F(KeptSpans, ASignalHandlerForkingInAReleaseOfKeptSpansDoesNotWaitForIt) {
  struct sigaction action {}, old {};
  action.sa_handler = ForkInHandler;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, &old), 0);
  struct Restore {
    struct sigaction old;
    ~Restore() {
      g_kept_release_test_hook.store(nullptr);
      sigaction(SIGUSR1, &old, nullptr);
      brisk_set_strategy(BRISK_STRATEGY_BALANCED);
    }
  } restore{old};
  EmptySpansOfAnExitedThread(4);
  ASSERT_GT(KeptBytes(), 0u);
  g_raised = false;
  g_handler_fork_status = -1;
  g_kept_release_test_hook.store(RaiseOnceInARelease);
  std::thread([] { brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY); }).join();  // keeps none
  EXPECT_TRUE(g_raised.load());
  EXPECT_EQ(g_handler_fork_status.load(), 7) << "the child of the handler's fork did not exit as it should";
  EXPECT_EQ(KeptBytes(), 0u) << "the interrupted release did not end";
}

// BRISK_KEPT_SPAN_BYTES bounds the pools' kept spans by the bytes their blocks wrote: the
// spans past it go back to their chunks at once (kept_span_budget_test runs this at 256k).
TEST_F(KeptSpans, TheBudgetBoundsTheKeptBytes) {
  const auto budget = static_cast<std::size_t>(options::get(options::Id::kKeptSpanBytes));
  const std::size_t each = round_to_os_page(kClasses[size_to_class(kSize)].size);
  constexpr int kSpans = 20;
  if (budget >= kSpans * each) GTEST_SKIP() << "run by kept_span_budget_test, BRISK_KEPT_SPAN_BYTES=256k";
  std::vector<Span*> spans;
  std::thread([&] {
    std::vector<void*> blocks;
    for (int i = 0; i < kSpans; ++i) blocks.push_back(brisk_malloc(kSize));
    void* other = brisk_malloc(kOtherSize);  // the class refilled last is another
    for (void* p : blocks) spans.push_back(span_of(p));
    for (void* p : blocks) brisk_free(p);
    brisk_free(other);
  }).join();
  std::size_t kept = 0;
  for (Span* s : spans) kept += s->kept;
  EXPECT_EQ(kept, budget / each);
  EXPECT_EQ(KeptBytes(), kept * each);
  EXPECT_LE(KeptBytes(), budget);
}

}  // namespace
}  // namespace brisk
