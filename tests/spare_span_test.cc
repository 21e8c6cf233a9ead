// Spare spans (threadcache/span_pages.cc): a span that empties while it is not its class's
// current span, every block having come back through the owner's remote queue, is kept whole
// for the class's next refill instead of going back to its chunk and being cut again. The
// budget, the purge checks' aging, brisk_thread_collect and brisk_trim. The process runs with
// BRISK_SPARE_SPAN_BYTES=256k (four 64 KiB spans), BRISK_BACKGROUND=0 and BRISK_PURGE_BYTES=1g
// (tests/CMakeLists.txt), so only the test's own calls release spares.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/chunk.h"
#include "core/platform.h"
#include "tests/test_util.h"
#include "threadcache/heap.h"
#include "threadcache/purge.h"

namespace {

using brisk::Span;

constexpr std::size_t kSize = 1024;  // a class of one-page spans: 64 blocks each
constexpr std::size_t kBudgetSpans = 4;  // BRISK_SPARE_SPAN_BYTES=256k

Span* SpanOf(void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return brisk::chunk_of(a)->span_of(a);
}

std::uint64_t ClassSpans() {
  std::vector<brisk_class_stats> v(BRISK_SIZE_CLASSES);
  brisk_get_class_stats(v.data(), v.size());
  for (const brisk_class_stats& k : v)
    if (k.block_size == kSize) return k.spans;
  ADD_FAILURE() << "no class of " << kSize << " B";
  return 0;
}

// On the calling thread (a fresh heap): fills `spans` spans of the class, which another thread
// then frees in full (remote frees, queued to this heap); returns them. The class's current
// span, the next one, holds one live block, *last.
std::vector<Span*> FillSpansFreedElsewhere(unsigned spans, void** last) {
  std::vector<void*> blocks;
  std::vector<Span*> full;
  for (;;) {
    void* p = brisk_malloc(kSize);
    brisk_test::Fill(p, kSize, reinterpret_cast<std::uintptr_t>(p));
    Span* s = SpanOf(p);
    if (full.empty() || full.back() != s) {
      if (full.size() == spans) {
        *last = p;
        break;
      }
      full.push_back(s);
    }
    blocks.push_back(p);
  }
  std::thread([&] {
    for (void* p : blocks) {
      EXPECT_TRUE(brisk_test::Verify(p, kSize, reinterpret_cast<std::uintptr_t>(p)));
      brisk_free(p);
    }
    brisk_thread_collect();  // its partial batches go out too
  }).join();
  // A refill of another class takes the queue: the spans empty there.
  brisk_free(brisk_malloc(3 * kSize));
  return full;
}

// s is still a span of the class, h's (a released span's pages may serve another class since).
bool HeldBy(Span* s, brisk::Heap* h) {
  return s->owner.load() == h && s->kind == brisk::SpanKind::kSmall && s->block_size == kSize;
}

TEST(SpareSpans, ASpanEmptiedByRemoteFreesIsReusedWithoutBeingCutAgain) {
  std::thread([] {
    void* last;
    std::vector<Span*> full = FillSpansFreedElsewhere(1, &last);
    Span* s = full[0];
    ASSERT_TRUE(HeldBy(s, brisk::t_heap)) << "the emptied span went back to its chunk";
    // The class's current span fills up, then its next block comes from s as it was.
    std::vector<void*> blocks;
    void* p;
    do {
      p = brisk_malloc(kSize);
      blocks.push_back(p);
    } while (SpanOf(p) == SpanOf(last) && blocks.size() < 1000);
    EXPECT_EQ(SpanOf(p), s);
    EXPECT_EQ(s->carved_bytes, s->span_bytes) << "its blocks were cut again";
    EXPECT_EQ(s->used, 1u);
    for (void* b : blocks) brisk_free(b);
    brisk_free(last);
  }).join();
}

TEST(SpareSpans, AHeapKeepsNoMoreThanTheBudget) {
  std::thread([] {
    std::uint64_t before = ClassSpans();
    void* last;
    std::vector<Span*> full = FillSpansFreedElsewhere(2 * kBudgetSpans, &last);
    unsigned held = 0;
    for (Span* s : full) held += HeldBy(s, brisk::t_heap);
    EXPECT_EQ(held, kBudgetSpans);
    EXPECT_EQ(brisk::t_heap->spare_bytes, kBudgetSpans * brisk::kPageSize);
    EXPECT_EQ(ClassSpans(), before + 1 + kBudgetSpans);  // the current span and the spares
    brisk_free(last);
  }).join();
}

TEST(SpareSpans, CollectGivesThemBack) {
  std::thread([] {
    std::uint64_t before = ClassSpans();
    void* last;
    FillSpansFreedElsewhere(kBudgetSpans, &last);
    ASSERT_EQ(ClassSpans(), before + 1 + kBudgetSpans);
    brisk_thread_collect();
    EXPECT_EQ(ClassSpans(), before + 1);
    EXPECT_EQ(brisk::t_heap->spare_bytes, 0u);
    brisk_free(last);
  }).join();
}

// From another thread, while the owner is alive (and waits): brisk_trim takes the spares of
// every heap whose slow lock is free.
TEST(SpareSpans, TrimTakesOtherThreadsSpares) {
  brisk_thread_collect();  // so that the trim below gives back nothing of this thread's
  std::uint64_t before = ClassSpans();
  std::atomic<int> step{0};
  std::thread owner([&] {
    void* last;
    FillSpansFreedElsewhere(kBudgetSpans, &last);
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    EXPECT_EQ(brisk::t_heap->spare_bytes, 0u);
    brisk_free(last);
  });
  while (step.load() != 1) std::this_thread::yield();
  EXPECT_EQ(ClassSpans(), before + 1 + kBudgetSpans);
  brisk_trim();
  EXPECT_EQ(ClassSpans(), before + 1);
  step = 2;
  owner.join();
}

std::atomic<std::uint64_t> g_fake_now{1'000'000};
std::uint64_t FakeClock() { return g_fake_now.load(); }

// A purge check marks the spares it finds; the next one, a purge delay later, releases those
// still spare: a class no longer used gives its spans back like free pages.
TEST(SpareSpans, APurgeCheckReleasesTheSparesThePreviousCheckSaw) {
  brisk::platform::set_clock_for_test(FakeClock);
  std::thread([] {
    std::uint64_t before = ClassSpans();
    void* last;
    FillSpansFreedElsewhere(kBudgetSpans, &last);
    brisk::Heap* h = brisk::t_heap;
    auto purge_check = [h] {
      g_fake_now += 10'000;  // past any BRISK_PURGE_DELAY_MS default
      brisk::HeapSlowLock lock(h);
      brisk::heap_purge(h, 1);
    };
    purge_check();
    EXPECT_EQ(ClassSpans(), before + 1 + kBudgetSpans) << "released at the first check";
    purge_check();
    EXPECT_EQ(ClassSpans(), before + 1);
    EXPECT_EQ(h->spare_bytes, 0u);
    brisk_free(last);
  }).join();
  brisk::platform::set_clock_for_test(nullptr);
}

}  // namespace
