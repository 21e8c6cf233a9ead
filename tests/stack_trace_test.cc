// debug/stack_trace: capture (depth, call sites, through a shared object built without frame
// pointers, through frames realigned with DRAP or saving RBP below another copy of it), the
// frame rules read from real frames' call-frame information (hand-made .eh_frame bytes:
// frame_rule_test), a memo's walks and their replays, the stack depot (one id per distinct
// stack, bounded memory under millions of stacks, concurrent stores), and frame symbolisation.
#include "debug/stack_trace.h"

#include <alloca.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/platform.h"
#include "debug/frame_rule.h"

#ifdef BRISK_TEST_SANITIZED
constexpr int kScale = 4;
#else
constexpr int kScale = 1;
#endif

using CaptureFn = int (*)(std::uintptr_t* frames, int max_depth, int skip);
extern "C" int nofp_capture(CaptureFn capture, std::uintptr_t* frames, int max_depth, std::uintptr_t* return_address);
extern "C" int drap_capture(CaptureFn capture, std::uintptr_t* frames, int max_depth, std::size_t bytes,
                            std::uintptr_t* return_address);
// libgcc's lookup of the FDE covering an address (unwind-dw2-fde.h).
struct EhBases {
  void* tbase;
  void* dbase;
  void* func;
};
extern "C" const void* _Unwind_Find_FDE(void* pc, EhBases* bases);

namespace {

using brisk::debug::capture_stack;
using brisk::debug::kNoStack;
using brisk::debug::StackDepot;

class StackTrace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(brisk::debug::stack_trace_init()); }
};

// Both call sites below are in separate noinline functions, so their stacks differ in frame 1.
__attribute__((noinline)) std::uint32_t RecordHere(StackDepot* depot) {
  std::uintptr_t frames[8];
  const int depth = capture_stack(frames, 8, 0);
  asm volatile("" ::: "memory");
  return depot->store(frames, depth);
}

__attribute__((noinline)) std::uint32_t SiteA(StackDepot* depot) {
  const std::uint32_t id = RecordHere(depot);
  asm volatile("" ::: "memory");
  return id;
}

__attribute__((noinline)) std::uint32_t SiteB(StackDepot* depot) {
  const std::uint32_t id = RecordHere(depot);
  asm volatile("" ::: "memory");
  return id;
}

TEST_F(StackTrace, TheSameCallSiteGivesTheSameIdAndDifferentSitesDiffer) {
  StackDepot depot;
  ASSERT_TRUE(depot.init(1024, 1 << 20));
  std::vector<std::uint32_t> a, b;
  for (int i = 0; i < 3; ++i) {
    a.push_back(SiteA(&depot));  // one call site, three times
    b.push_back(SiteB(&depot));
  }
  ASSERT_NE(a[0], kNoStack);
  EXPECT_EQ(a[1], a[0]);
  EXPECT_EQ(a[2], a[0]);
  EXPECT_EQ(b[1], b[0]);
  EXPECT_NE(a[0], b[0]);
  EXPECT_EQ(depot.stored(), 2u);
  const std::uintptr_t* frames = nullptr;
  EXPECT_EQ(depot.fetch(a[0], &frames), 8);
}

TEST_F(StackTrace, DepthIsHonouredAndSkipDropsTheInnermostFrames) {
  std::uintptr_t frames[brisk::debug::kMaxStackDepth];
  EXPECT_EQ(capture_stack(frames, 0, 0), 0);
  EXPECT_EQ(capture_stack(frames, 1, 0), 1);
  EXPECT_EQ(capture_stack(frames, 3, 0), 3);
  const int all = capture_stack(frames, brisk::debug::kMaxStackDepth, 0);
  EXPECT_GT(all, 4);  // this test, gtest's runner frames, main
  std::uintptr_t skipped[brisk::debug::kMaxStackDepth];
  const int fewer = capture_stack(skipped, brisk::debug::kMaxStackDepth, 2);
  ASSERT_EQ(fewer, all - 2);
  // Frames above this function are the same in both captures.
  EXPECT_TRUE(std::equal(skipped + 1, skipped + fewer, frames + 3));
}

// The test's own functions are compiled without frame pointers too (tests/CMakeLists.txt).
__attribute__((noinline)) int CallThroughLibrary(std::uintptr_t* frames, int max_depth, std::uintptr_t* into_caller,
                                                 std::uintptr_t* into_callers_caller) {
  *into_callers_caller = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
  const int depth = nofp_capture(capture_stack, frames, max_depth, into_caller);
  asm volatile("" ::: "memory");
  return depth;
}

TEST_F(StackTrace, ACaptureInsideAFramePointerlessLibraryFindsItsCallers) {
  std::uintptr_t frames[16];
  std::uintptr_t into_caller = 0, into_callers_caller = 0;
  const int depth = CallThroughLibrary(frames, 16, &into_caller, &into_callers_caller);
  ASSERT_GE(depth, 3);
  // frames[0] is inside nofp_capture; then its return into CallThroughLibrary; then into this test.
  EXPECT_EQ(frames[1], into_caller);
  EXPECT_EQ(frames[2], into_callers_caller);
  char text[512];
  brisk::debug::format_frame(frames[0], text, sizeof text);
  EXPECT_NE(std::string(text).find("libbrisk_stack_trace_nofp.so+0x"), std::string::npos) << text;
  EXPECT_NE(std::string(text).find("(nofp_capture+0x"), std::string::npos) << text;
}

// Two million distinct stacks into a depot bounded at 100,000: the rest are dropped and counted,
// the mapping never grows, and a stack stored before the depot filled still finds its id.
TEST_F(StackTrace, TheDepotStaysBoundedUnderMillionsOfStacks) {
  constexpr std::uint32_t kLimit = 100000;
  constexpr int kDepth = 8;
  StackDepot depot;
  ASSERT_TRUE(depot.init(kLimit, kLimit * (8 + 8 * kDepth)));
  const std::size_t mapped = depot.mapped_bytes();
  EXPECT_LE(mapped, std::size_t{16} << 20);
  const std::size_t total = 2000000 / kScale;
  std::uintptr_t frames[kDepth];
  std::vector<std::uint32_t> first_ids;
  for (std::size_t i = 0; i < total; ++i) {
    for (int k = 0; k < kDepth; ++k) frames[k] = 0x400000 + i * 64 + static_cast<std::size_t>(k);
    const std::uint32_t id = depot.store(frames, kDepth);
    if (i < 10) first_ids.push_back(id);
    if (i < kLimit) {
      ASSERT_NE(id, kNoStack) << i;
    } else {
      ASSERT_EQ(id, kNoStack) << i;
    }
  }
  EXPECT_EQ(depot.stored(), kLimit);
  EXPECT_EQ(depot.dropped(), total - kLimit);
  EXPECT_EQ(depot.mapped_bytes(), mapped);
  for (std::size_t i = 0; i < 10; ++i) {
    for (int k = 0; k < kDepth; ++k) frames[k] = 0x400000 + i * 64 + static_cast<std::size_t>(k);
    EXPECT_EQ(depot.store(frames, kDepth), first_ids[i]);
    const std::uintptr_t* stored = nullptr;
    ASSERT_EQ(depot.fetch(first_ids[i], &stored), kDepth);
    EXPECT_EQ(std::memcmp(stored, frames, sizeof frames), 0);
  }
}

TEST_F(StackTrace, ConcurrentStoresOfTheSameStacksAgreeOnTheirIds) {
  constexpr int kStacks = 2000;
  StackDepot depot;
  ASSERT_TRUE(depot.init(kStacks, kStacks * 64));
  std::vector<std::uint32_t> ids[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&depot, &ids, t] {
      for (int i = 0; i < kStacks; ++i) {
        const std::uintptr_t frames[3] = {static_cast<std::uintptr_t>(i) + 1, 2, 3};
        ids[t].push_back(depot.store(frames, 3));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(depot.stored(), static_cast<std::size_t>(kStacks));
  EXPECT_EQ(std::count(ids[0].begin(), ids[0].end(), kNoStack), 0);
}

// Two threads store the same new stack into a depot one stack short of full: the one that finds
// it published by the other as it was about to write its own copy must return that id, not
// count the depot full and drop the stack (a race ConcurrentStoresOfTheSameStacksAgreeOnTheirIds
// hit once under ThreadSanitizer). Many rounds, each a fresh depot: the window is narrow.
TEST_F(StackTrace, TheSameStackStoredAtOnceIntoTheLastRoomIsKeptForBoth) {
  constexpr int kRounds = 3000 / kScale;
  int dropped = 0;
  for (int round = 0; round < kRounds && dropped == 0; ++round) {
    StackDepot depot;
    ASSERT_TRUE(depot.init(4, 4096));
    for (std::uintptr_t i = 1; i <= 3; ++i) {
      const std::uintptr_t frames[2] = {i, 7};
      ASSERT_NE(depot.store(frames, 2), kNoStack);
    }
    std::atomic<int> ready{0};
    std::uint32_t ids[2];
    auto store_last = [&](int t) {
      const std::uintptr_t frames[2] = {4, 7};
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      ids[t] = depot.store(frames, 2);
    };
    std::thread other(store_last, 1);
    store_last(0);
    other.join();
    if (ids[0] == kNoStack || ids[1] == kNoStack || ids[0] != ids[1]) ++dropped;
    EXPECT_EQ(depot.stored(), 4u);
  }
  EXPECT_EQ(dropped, 0);
}

TEST_F(StackTrace, AnEmptyStackHasNoId) {
  StackDepot depot;
  ASSERT_TRUE(depot.init(16, 4096));
  std::uintptr_t frame = 1;
  EXPECT_EQ(depot.store(&frame, 0), kNoStack);
  const std::uintptr_t* frames = nullptr;
  EXPECT_EQ(depot.fetch(kNoStack, &frames), 0);
}

// ---- The frame cache: a cached capture is the unwinder's, frame for frame ----------------------

struct Capture {
  int depth = 0;
  std::uintptr_t frames[brisk::debug::kMaxStackDepth];
};

// Both captures are made from the same call site, so that they must agree from frame 0 on.
__attribute__((noinline)) void CaptureAt(CaptureFn capture, Capture* out, int max_depth) {
  out->depth = capture(out->frames, max_depth, 0);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void Chain(int n, CaptureFn capture, Capture* out, int max_depth) {
  if (n == 0) CaptureAt(capture, out, max_depth);
  else Chain(n - 1, capture, out, max_depth);
  asm volatile("" ::: "memory");
}

// A frame whose size changes from call to call: a cached size for its return address would
// walk the frames above it wrongly.
__attribute__((noinline)) void Alloca(std::size_t bytes, int n, CaptureFn capture, Capture* out, int max_depth) {
  char* buffer = static_cast<char*>(alloca(bytes));
  asm volatile("" : : "r"(buffer) : "memory");
  Chain(n, capture, out, max_depth);
  asm volatile("" ::: "memory");
}

// Captures the same stack twice through one call site: with capture_stack, then with the
// unwinder alone. bytes > 0 puts an Alloca frame of bytes, then bytes + 40, below the chain.
__attribute__((noinline)) void CaptureBoth(int n, std::size_t bytes, int max_depth, Capture* cached, Capture* unwound) {
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    CaptureFn capture = i == 0 ? static_cast<CaptureFn>(capture_stack) : brisk::debug::capture_stack_unwound;
    Capture* out = i == 0 ? cached : unwound;
    if (bytes == 0) Chain(n, capture, out, max_depth);
    else Alloca(bytes + 40 * static_cast<std::size_t>(i), n, capture, out, max_depth);
  }
  asm volatile("" ::: "memory");
}

void ExpectSameFrames(const Capture& cached, const Capture& unwound, const char* where) {
  ASSERT_GT(unwound.depth, 0) << where;
  ASSERT_EQ(cached.depth, unwound.depth) << where;
  for (int i = 0; i < unwound.depth; ++i) ASSERT_EQ(cached.frames[i], unwound.frames[i]) << where << " frame " << i;
}

TEST_F(StackTrace, CachedCapturesAreTheUnwindersAndRepeatedStacksComeFromTheCache) {
  for (int round = 0; round < 3; ++round) {
    for (int n = 0; n < 4; ++n) {
      for (int depth : {8, brisk::debug::kMaxStackDepth}) {
        Capture cached, unwound;
        CaptureBoth(n, 0, depth, &cached, &unwound);
        ExpectSameFrames(cached, unwound, "chain");
        CaptureBoth(n, 64 + 48 * static_cast<std::size_t>(round * 4 + n), depth, &cached, &unwound);
        ExpectSameFrames(cached, unwound, "alloca");
      }
    }
  }
  // From one call site twice: the second capture of a stack walked before is served by the
  // cache alone. 6 frames end at CaptureBoth's: the test's own frames, not gtest's, whose
  // rules the cache may not know.
  for (int k = 0; k < 2; ++k) {
    asm volatile("" : "+r"(k));
    Capture cached, unwound;
    const auto before = brisk::debug::capture_counts();
    CaptureBoth(2, 0, 6, &cached, &unwound);
    const auto after = brisk::debug::capture_counts();
    ExpectSameFrames(cached, unwound, "counted");
    if (k == 1) {
      EXPECT_EQ(after.cached, before.cached + 1);
      EXPECT_EQ(after.unwound, before.unwound);
    }
  }
}

// A memo (stack_trace.h's WalkMemo) for the test's own thread.
brisk::debug::WalkMemo g_memo;
bool g_same = false;
// The frames of the memo's last capture: a capture that says "same" may leave its frames
// unwritten, and stands for these (so each test's comparison with the unwinder checks the
// claim).
Capture g_memo_last;
__attribute__((noinline)) int MemoCapture(std::uintptr_t* frames, int max_depth, int skip) {
  const int depth = capture_stack(frames, max_depth, skip + 1, &g_memo, &g_same);
  asm volatile("" ::: "memory");  // no tail call: skip + 1 counts this frame
  if (g_same) {
    EXPECT_EQ(depth, g_memo_last.depth);
    std::copy(g_memo_last.frames, g_memo_last.frames + g_memo_last.depth, frames);
  } else if (depth >= 0) {
    g_memo_last.depth = depth;
    std::copy(frames, frames + depth, g_memo_last.frames);
  }
  return depth;
}

// Captures through the memo and with the unwinder alone from one call site.
__attribute__((noinline)) void MemoAndUnwound(int n, std::size_t bytes, int max_depth, Capture* memo, bool* same,
                                              Capture* unwound) {
  CaptureFn const captures[2] = {MemoCapture, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {memo, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    if (bytes == 0) Chain(n, captures[i], outs[i], max_depth);
    else Alloca(bytes, n, captures[i], outs[i], max_depth);
    if (i == 0) *same = g_same;
  }
  asm volatile("" ::: "memory");
}

// A walk through a memo reads the entries of the return addresses it shares with the memo's
// last walk from the memo: its frames are still the unwinder's, chains of other lengths and
// frames of other sizes included, and it says "same" exactly when its frames are the last
// walk's (the debug layer then reuses that walk's depot id).
TEST_F(StackTrace, AWalkThroughAMemoIsTheUnwindersAndSaysWhenItRepeatsTheLastOne) {
  Capture last;  // the frames of the capture before
  for (int round = 0; round < 3; ++round) {
    for (int n = 0; n < 4; ++n) {
      for (int depth : {3, 6, 8, brisk::debug::kMaxStackDepth}) {
        for (std::size_t bytes : {std::size_t{0}, 64 + 48 * static_cast<std::size_t>(round * 4 + n)}) {
          Capture memo[2], unwound[2];
          bool same[2] = {true, false};
          for (int k = 0; k < 2; ++k) {
            asm volatile("" : "+r"(k));  // one call site for both: the same stack twice
            MemoAndUnwound(n, bytes, depth, &memo[k], &same[k], &unwound[k]);
          }
          ExpectSameFrames(memo[0], unwound[0], "memo");
          ExpectSameFrames(memo[1], unwound[1], "memo again");
          ExpectSameFrames(memo[1], memo[0], "memo repeated");
          // Never "same" when the frames differ from the capture before (at depth 3 a chain
          // of one or more under Alloca has the same innermost frames as without it).
          const bool repeated = last.depth == memo[0].depth &&
                                std::equal(last.frames, last.frames + last.depth, memo[0].frames);
          if (!repeated) {
            EXPECT_FALSE(same[0]) << round << " " << n << " " << depth << " " << bytes;
          }
          last = memo[1];
          // Once the cache knows every return address (round 0 taught it), a repeat within
          // the 16 return addresses a memo keeps is recognised: here where the frames end in
          // this test's own functions (CaptureAt, n + 1 Chains, MemoAndUnwound, the test
          // body), whose rules the cache knows, not in gtest's, which it may not.
          if (round > 0 && depth <= n + 4) {
            EXPECT_TRUE(same[1]) << round << " " << n << " " << depth << " " << bytes;
          }
        }
      }
    }
  }
}

// Two callers of one function, with frames of the same size: called from one place, the
// function's frame and everything below it lie at the same addresses under either, and only
// the return address into the caller tells the two stacks apart.
std::uintptr_t g_inner_frame = 0;
CaptureFn g_inner_capture = nullptr;
__attribute__((noinline)) void Inner(Capture* out, int max_depth) {
  g_inner_frame = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  Chain(2, g_inner_capture, out, max_depth);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void OuterA(Capture* out, int max_depth) {
  asm volatile("" : : "i"(1));  // not folded into OuterB
  Inner(out, max_depth);
  asm volatile("" ::: "memory");
}
__attribute__((noinline)) void OuterB(Capture* out, int max_depth) {
  asm volatile("" : : "i"(2));
  Inner(out, max_depth);
  asm volatile("" ::: "memory");
}
// Captures under OuterA or OuterB through the memo, then with the unwinder alone, from one
// call site; *inner_frame: Inner's frame address each time.
__attribute__((noinline)) void CaptureUnder(bool b, int max_depth, Capture* memo, bool* same, Capture* unwound,
                                            std::uintptr_t inner_frame[2]) {
  CaptureFn const captures[2] = {MemoCapture, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {memo, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    g_inner_capture = captures[i];
    auto outer = b ? OuterB : OuterA;
    asm volatile("" : "+r"(outer));  // one call site for both callers
    outer(outs[i], max_depth);
    inner_frame[i] = g_inner_frame;
    if (i == 0) *same = g_same;
  }
  asm volatile("" ::: "memory");
}

// RBP is an ordinary register in code built without frame pointers: here it holds a different
// value at each call, which the capture starts with (CaptureAt and MemoCapture leave it be).
// No frame on the way uses it (ScrambledRbp saves and restores it, and the walk loads the
// caller's from its save slot), so the replay must not compare it. x86-64 GCC without
// sanitizers: they keep frame pointers, and RBP may then not be clobbered (nor, in clang, ever).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BRISK_TEST_SANITIZED)
#define BRISK_TEST_SCRAMBLED_RBP 1
__attribute__((noinline, optimize("omit-frame-pointer"))) void ScrambledRbp(std::uintptr_t value, Capture* out,
                                                                            int max_depth) {
  asm volatile("mov %0, %%rbp" : : "r"(value) : "rbp");
  CaptureAt(MemoCapture, out, max_depth);
  asm volatile("" ::: "memory");
}
#endif

// A walk that starts where the memo's last one did, through frames at the same addresses, may
// skip the walk and take the last one's frames only if every word the walk would read is the
// same: here the one that differs is a return address four frames up (Inner's, into OuterA or
// OuterB). The frames are the unwinder's, "same" is said only of a repeat, and a repeat is
// recognised (the replay; it failed with a replay that compared all but the last word it read).
TEST_F(StackTrace, AWalkThatStartsWhereTheLastOneDidIsTheLastOneOnlyIfEveryWordItReadsIs) {
  std::uintptr_t first_frame = 0;
  // Frames: CaptureAt, three Chains, Inner, the Outer, CaptureUnder. With 6 or 7 the walk
  // reads the return address into the Outer, and needs no rule the cache may lack (CaptureUnder's
  // frame is one it may not keep).
  for (int depth : {6, 7}) {
    bool previous = false;
    for (int round = 0; round < 13; ++round) {
      const bool b = (round % 3) != 0;  // A, B, B, A, B, B, ...
      Capture memo, unwound;
      bool same = false;
      std::uintptr_t frame[2];
      const auto before = brisk::debug::capture_counts();
      CaptureUnder(b, depth, &memo, &same, &unwound, frame);
      const auto after = brisk::debug::capture_counts();
      if (first_frame == 0) first_frame = frame[0];
      ASSERT_EQ(frame[0], first_frame) << "OuterA's and OuterB's frames differ in size: the test needs them equal";
      ASSERT_EQ(frame[1], first_frame);
      ExpectSameFrames(memo, unwound, "memo");
      // Rounds 0 and 1 teach the cache the Outers' rules (a walk through a return address the
      // cache lacks unwinds, and leaves no memo); from round 3 on the walk before went through
      // known return addresses, and a repeat is recognised.
      if (round >= 3) {
        EXPECT_EQ(same, b == previous) << "depth " << depth << " round " << round;
        // A repeat is a replay (the walk that recorded it went through known rules); any other
        // capture walks.
        EXPECT_EQ(after.replayed - before.replayed, b == previous ? 1u : 0u) << "depth " << depth << " round " << round;
      }
      previous = b;
    }
  }
}

#ifdef BRISK_TEST_SCRAMBLED_RBP
// A capture whose start RBP changes at every call, but which no frame uses, is replayed: the
// frames are the first capture's, and each capture after the walks that teach the cache and
// record the memo is a replay (every one walked when the start RBP was compared).
TEST_F(StackTrace, AStartRbpThatNoFrameUsesDoesNotStopAReplay) {
  Capture first;
  for (int i = 0; i < 20; ++i) {
    Capture c;
    const auto before = brisk::debug::capture_counts();
    ScrambledRbp(0x1000 + 0x40 * static_cast<std::uintptr_t>(i), &c, 3);  // CaptureAt, ScrambledRbp, the test
    const auto after = brisk::debug::capture_counts();
    if (i == 0) first = c;
    ExpectSameFrames(c, first, "scrambled rbp");
    if (i >= 3) {
      EXPECT_EQ(after.replayed - before.replayed, 1u) << i;
    }
  }
}
#endif

// Only this test calls it: its return address is new to the cache here.
__attribute__((noinline)) void FreshAlloca(std::size_t bytes, CaptureFn capture, Capture* out) {
  char* buffer = static_cast<char*>(alloca(bytes));
  asm volatile("" : : "r"(buffer) : "memory");
  Chain(3, capture, out, 8);  // 8 frames from CaptureAt to the test's own
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void FreshAllocaBoth(std::size_t bytes, Capture* cached, Capture* unwound) {
  CaptureFn const captures[2] = {capture_stack, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {cached, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    FreshAlloca(bytes, captures[i], outs[i]);
  }
  asm volatile("" ::: "memory");
}

// A frame that keeps a frame pointer (alloca makes one) changes its size from call to call:
// the cache walks it through its RBP, never by a size it saw once.
TEST_F(StackTrace, AFrameWithAFramePointerIsWalkedThroughItsRbpWhateverItsSize) {
  bool first = true;
  for (std::size_t bytes : {std::size_t{64}, std::size_t{64}, std::size_t{4000}, std::size_t{200}, std::size_t{1000}}) {
    Capture cached, unwound;
    const auto before = brisk::debug::capture_counts();
    FreshAllocaBoth(bytes, &cached, &unwound);
    const auto after = brisk::debug::capture_counts();
    ExpectSameFrames(cached, unwound, "fresh alloca");
    if (!first) {  // the first walk taught the cache
      EXPECT_EQ(after.cached, before.cached + 1) << bytes;
      EXPECT_EQ(after.unwound, before.unwound) << bytes;
    }
    first = false;
  }
}

// A frame that realigns its stack for an over-aligned local keeps a frame pointer: CFA =
// RBP + 16 at any alignment of the stack it was called on.
__attribute__((noinline)) void Realigned(long a, long b, long c, long d, long e, long f, CaptureFn capture, Capture* out) {
  alignas(64) char buffer[64];
  buffer[0] = static_cast<char>(a + b + c + d + e + f);
  asm volatile("" : : "r"(buffer) : "memory");
  Chain(3, capture, out, 8);
  asm volatile("" ::: "memory");
}

volatile long g_argument = 1;

__attribute__((noinline)) void RealignedBoth(Capture* cached, Capture* unwound) {
  CaptureFn const captures[2] = {capture_stack, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {cached, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    Realigned(g_argument, g_argument, g_argument, g_argument, g_argument, g_argument, captures[i], outs[i]);
  }
  asm volatile("" ::: "memory");
}

TEST_F(StackTrace, AFrameThatRealignsItsStackIsWalkedThroughItsRbp) {
  for (int round = 0; round < 3; ++round) {
    Capture cached, unwound;
    const auto before = brisk::debug::capture_counts();
    RealignedBoth(&cached, &unwound);
    const auto after = brisk::debug::capture_counts();
    ExpectSameFrames(cached, unwound, "realigned");
    if (round > 0) {  // the first walk taught the cache
      EXPECT_EQ(after.cached, before.cached + 1) << round;
      EXPECT_EQ(after.unwound, before.unwound) << round;
    }
  }
}

Capture g_signal_cached, g_signal_unwound;
void CaptureInSignal(int) { CaptureBoth(1, 0, brisk::debug::kMaxStackDepth, &g_signal_cached, &g_signal_unwound); }

// Through a signal handler: the trampoline finds its caller through the signal context, not
// at CFA - 8, so the cache must leave that walk to the unwinder, and it must end the same.
TEST_F(StackTrace, ACapturedStackThroughASignalHandlerIsTheUnwinders) {
  struct sigaction action {}, old {};
  action.sa_handler = CaptureInSignal;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &action, &old), 0);
  for (int round = 0; round < 3; ++round) {
    g_signal_cached.depth = g_signal_unwound.depth = 0;
    ASSERT_EQ(raise(SIGUSR1), 0);
    ExpectSameFrames(g_signal_cached, g_signal_unwound, "signal");
  }
  sigaction(SIGUSR1, &old, nullptr);
}

// A thread's whole stack, to its outermost frame, where a cached walk must stop as the
// unwinder does.
TEST_F(StackTrace, AThreadsWholeStackEndsWhereTheUnwindersEnds) {
  for (int round = 0; round < 3; ++round) {
    Capture cached, unwound;
    std::thread([&] { CaptureBoth(round, 0, brisk::debug::kMaxStackDepth, &cached, &unwound); }).join();
    ExpectSameFrames(cached, unwound, "thread");
    EXPECT_LT(unwound.depth, brisk::debug::kMaxStackDepth);
  }
}

// ---- Frames the cache learns from their call-frame information -------------------------------

using brisk::debug::FrameRule;

FrameRule RuleAt(std::uintptr_t return_address) {
  EhBases bases{};
  const void* fde = _Unwind_Find_FDE(reinterpret_cast<void*>(return_address - 1), &bases);
  FrameRule rule;
  EXPECT_NE(fde, nullptr);
  if (fde != nullptr) {
    EXPECT_TRUE(brisk::debug::read_frame_rule(fde, reinterpret_cast<std::uintptr_t>(bases.func), return_address, &rule));
  }
  return rule;
}

__attribute__((noinline)) void DrapBoth(std::size_t bytes, Capture* cached, Capture* unwound, std::uintptr_t* into_caller) {
  CaptureFn const captures[2] = {capture_stack, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {cached, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    outs[i]->depth = drap_capture(captures[i], outs[i]->frames, 8, bytes + 48 * static_cast<std::size_t>(i), into_caller);
  }
  asm volatile("" ::: "memory");
}

// GCC's DRAP frame (libtbb's task dispatch has them: every capture through a TBB worker went to
// the unwinder): the CFA is a word saved below RBP, at any realignment and alloca size.
TEST_F(StackTrace, AFrameRealignedThroughADrapRegisterIsWalkedFromTheCache) {
  for (int round = 0; round < 4; ++round) {
    Capture cached, unwound;
    std::uintptr_t into_caller = 0;
    const auto before = brisk::debug::capture_counts();
    DrapBoth(16 + 200 * static_cast<std::size_t>(round), &cached, &unwound, &into_caller);
    const auto after = brisk::debug::capture_counts();
    ExpectSameFrames(cached, unwound, "drap");
    ASSERT_GE(unwound.depth, 2);
    EXPECT_EQ(unwound.frames[1], into_caller);
    if (round == 0) {
      // The frame under test really is a DRAP frame in this build: CFA = *(RBP - 8k), the
      // caller's RBP at RBP.
      const FrameRule rule = RuleAt(unwound.frames[0]);
      EXPECT_EQ(rule.cfa, FrameRule::Cfa::kLoadRbp);
      EXPECT_LT(rule.cfa_offset, 0);
      EXPECT_EQ(rule.rbp, FrameRule::Saved::kAtRbp);
      EXPECT_EQ(rule.rbp_offset, 0);
    } else {  // the first walk taught the cache
      EXPECT_EQ(after.cached, before.cached + 1) << round;
      EXPECT_EQ(after.unwound, before.unwound) << round;
    }
  }
}

}  // namespace

// Two frames written in assembly so that the registers at each call are known:
// brisk_test_slot_outer keeps a frame pointer and calls brisk_test_slot_inner with R12 holding
// either its own RBP (rcx == 0) or its stack pointer at the call (rcx != 0). The inner frame
// saves R12 at CFA - 16 and RBP at CFA - 24, clears RBP and calls capture(frames, max_depth, 0).
// With R12 == RBP both slots hold the outer frame's RBP: only the call-frame information says
// which one is RBP's.
extern "C" int brisk_test_slot_outer(CaptureFn capture, std::uintptr_t* frames, int max_depth, long r12_is_rsp);
asm(R"(
  .text
  .globl brisk_test_slot_outer
  .hidden brisk_test_slot_outer
  .type brisk_test_slot_outer, @function
  .p2align 4
brisk_test_slot_outer:
  .cfi_startproc
  push %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  mov %rsp, %rbp
  .cfi_def_cfa_register %rbp
  push %r12
  .cfi_offset %r12, -24
  sub $8, %rsp
  mov %rbp, %r12
  test %rcx, %rcx
  cmovnz %rsp, %r12
  call brisk_test_slot_inner
  add $8, %rsp
  pop %r12
  pop %rbp
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size brisk_test_slot_outer, .-brisk_test_slot_outer

  .type brisk_test_slot_inner, @function
  .p2align 4
brisk_test_slot_inner:
  .cfi_startproc
  push %r12
  .cfi_def_cfa_offset 16
  .cfi_offset %r12, -16
  push %rbp
  .cfi_def_cfa_offset 24
  .cfi_offset %rbp, -24
  sub $8, %rsp
  .cfi_def_cfa_offset 32
  xor %ebp, %ebp
  mov %rdi, %rax
  mov %rsi, %rdi
  mov %edx, %esi
  xor %edx, %edx
  call *%rax
  add $8, %rsp
  .cfi_def_cfa_offset 24
  pop %rbp
  .cfi_def_cfa_offset 16
  pop %r12
  .cfi_def_cfa_offset 8
  ret
  .cfi_endproc
  .size brisk_test_slot_inner, .-brisk_test_slot_inner
)");

namespace {

__attribute__((noinline)) void SaveSlotBoth(long r12_is_rsp, int max_depth, Capture* cached, Capture* unwound) {
  CaptureFn const captures[2] = {capture_stack, brisk::debug::capture_stack_unwound};
  Capture* const outs[2] = {cached, unwound};
  for (int i = 0; i < 2; ++i) {
    asm volatile("" : "+r"(i));  // one call site for both: no unrolling
    outs[i]->depth = brisk_test_slot_outer(captures[i], outs[i]->frames, max_depth, r12_is_rsp);
  }
  asm volatile("" ::: "memory");
}

// Learnt from the values of one walk, the inner frame's RBP could be either slot; taken from
// the nearer one, the next walk (R12 now the outer frame's stack pointer) walked the outer frame
// from a wrong RBP and returned a garbage third frame. 3 frames end at that one.
TEST_F(StackTrace, ARbpSaveSlotComesFromTheFrameInfoNotFromAWalksValues) {
  for (int round = 0; round < 4; ++round) {
    for (int depth : {3, 8}) {
      Capture cached, unwound;
      const auto before = brisk::debug::capture_counts();
      SaveSlotBoth(round % 2, depth, &cached, &unwound);
      const auto after = brisk::debug::capture_counts();
      ExpectSameFrames(cached, unwound, round % 2 == 0 ? "r12 == rbp" : "r12 == rsp");
      if (round > 0) {  // the first walk taught the cache
        EXPECT_EQ(after.cached, before.cached + 1) << round << " depth " << depth;
        EXPECT_EQ(after.unwound, before.unwound) << round << " depth " << depth;
      }
    }
  }
  Capture cached, unwound;
  SaveSlotBoth(0, 3, &cached, &unwound);
  const FrameRule rule = RuleAt(unwound.frames[0]);
  EXPECT_EQ(rule.cfa, FrameRule::Cfa::kRspOffset);
  EXPECT_EQ(rule.cfa_offset, 32);
  EXPECT_EQ(rule.rbp, FrameRule::Saved::kAtCfa);
  EXPECT_EQ(rule.rbp_offset, -24);
}

}  // namespace
