// The leak report at exit (debug/leaks.cc) through report_leaks: its groups, and which blocks
// it lists: those no pointer in the program's memory reaches any more (the conservative mark),
// every live block while another thread runs, and readable pages only. Reports go to a
// callback (the DebugMode fixture). Linked with ENABLE_EXPORTS, so that the reports name this
// file's functions through dladdr.
#include <brisk/brisk.h>

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/platform.h"
#include "debug/block.h"
#include "threadcache/background.h"
#include "tests/debug_mode_fixture.h"

// Exported (the test links with ENABLE_EXPORTS), so the report names it through dladdr.
__attribute__((noinline)) void* LeakFromHere(size_t size) {
  void* p = brisk_malloc(size);
  asm volatile("" ::: "memory");  // keeps the call a call, not a tail jump
  return p;
}

namespace {

TEST_F(DebugMode, TheLeakReportGroupsLiveBlocksByTheirAllocationStack) {
  void* blocks[3];
  const size_t sizes[3] = {10, 30, 20};
  for (int i = 0; i < 3; ++i) blocks[i] = LeakFromHere(sizes[i]);  // one call site: one stack
  EXPECT_GE(brisk::debug::report_leaks(brisk::debug::LeakScope::kAll), 1);
  std::string r = Reports();
  size_t at = r.find("brisk: leak: 3 blocks, 60 bytes (sizes 10..30)");
  ASSERT_NE(at, std::string::npos) << r;
  size_t end = r.find("brisk: leak:", at + 1);
  std::string group = r.substr(at, end == std::string::npos ? std::string::npos : end - at);
  EXPECT_NE(group.find("LeakFromHere"), std::string::npos) << group;
  for (void* p : blocks) brisk_free(p);
}

}  // namespace

// Exported, as LeakFromHere: the report names them. Each makes two blocks, the second pointed
// to from the first only; KeepReachable keeps the first in a global, LoseUnreachable keeps only
// its address masked (no word in memory holds it), and both scrub the stack they used.
struct Node {
  Node* next;
  char payload[40];
};
Node* g_reachable_root;
uintptr_t g_masked_root;
constexpr uintptr_t kMask = 0x5a5a5a5a5a5a5a5aull;

__attribute__((noinline)) void ScrubStack() {
  volatile char scratch[64 * 1024];
  for (size_t i = 0; i < sizeof scratch; ++i) scratch[i] = 0;
}
__attribute__((noinline)) Node* TwoNodes() {
  Node* a = static_cast<Node*>(brisk_malloc(sizeof(Node)));
  a->next = static_cast<Node*>(brisk_malloc(sizeof(Node)));
  a->next->next = nullptr;
  asm volatile("" ::: "memory");
  return a;
}
__attribute__((noinline)) void KeepReachable() { g_reachable_root = TwoNodes(); }
__attribute__((noinline)) void LoseUnreachable() { g_masked_root = reinterpret_cast<uintptr_t>(TwoNodes()) ^ kMask; }

namespace {

// The default report lists the blocks nothing points to any more (the chain whose root was
// lost: both of its blocks), not those a global reaches, directly or through another block.
// Whether report_leaks can scan: no thread runs but this one and brisk's background thread
// (ThreadSanitizer's runtime keeps a thread of its own once a test has started threads).
bool LeakScanPossible() {
  const size_t background = brisk::background_pause();
  brisk::background_resume();
  return brisk::platform::process_thread_count() == 1 + background;
}

TEST_F(DebugMode, TheLeakReportListsOnlyBlocksNoPointerReaches) {
  if (!LeakScanPossible()) GTEST_SKIP() << "another thread runs: no scan";
  LoseUnreachable();
  KeepReachable();
  ScrubStack();
  brisk::debug::LeakSummary sum{};
  brisk::debug::report_leaks(brisk::debug::LeakScope::kUnreachable, &sum);
  ASSERT_TRUE(sum.scanned) << "the test runs with one thread";
  std::string r = Reports();
  // Two groups (TwoNodes's two calls are two stacks), each of one 48-byte block.
  size_t at = r.find("LoseUnreachable");
  ASSERT_NE(at, std::string::npos) << r;
  EXPECT_NE(r.find("LoseUnreachable", at + 1), std::string::npos) << r;
  EXPECT_NE(r.rfind("brisk: leak: 1 block, 48 bytes (sizes 48) unreachable at exit", at), std::string::npos) << r;
  EXPECT_EQ(r.find("KeepReachable"), std::string::npos) << r;
  EXPECT_GE(sum.reported_blocks, 2u);
  EXPECT_GE(sum.reachable_blocks, 2u);
  EXPECT_NE(r.find("brisk: leaks: not listed, "), std::string::npos) << r;

  // BRISK_DEBUG_LEAKS=2's scope: every live block.
  brisk::debug::LeakSummary all{};
  brisk::debug::report_leaks(brisk::debug::LeakScope::kAll, &all);
  EXPECT_FALSE(all.scanned);
  EXPECT_EQ(all.reported_blocks, sum.reported_blocks + sum.reachable_blocks);
  EXPECT_NE(Reports().find("KeepReachable"), std::string::npos);

  Node* lost = reinterpret_cast<Node*>(g_masked_root ^ kMask);
  brisk_free(lost->next);
  brisk_free(lost);
  brisk_free(g_reachable_root->next);
  brisk_free(g_reachable_root);
  g_reachable_root = nullptr;
}

// A block the program keeps, part of which it made inaccessible (a guard page, as coroutine
// stacks have): the scan reads only readable pages (it read the block whole, and the process
// died at exit), and the block is reachable, not listed. Run again with brisk's background
// thread started (debug_leak_background_test): its passes wait while the scan reads.
TEST_F(DebugMode, TheLeakScanSkipsPagesTheProgramMadeInaccessible) {
  {
    // Two live heaps and a strategy switch start brisk-bg, if BRISK_BACKGROUND lets it run.
    std::atomic<bool> go{false}, allocated{false};
    std::thread second([&] {
      brisk_free(brisk_malloc(64));
      allocated = true;
      while (!go.load()) std::this_thread::yield();
    });
    while (!allocated.load()) std::this_thread::yield();
    brisk_free(brisk_malloc(64));
    brisk_set_strategy(brisk_get_strategy());
    go = true;
    second.join();
  }
  const char* background = getenv("BRISK_BACKGROUND");
  if (background != nullptr && std::string(background) == "1") {
    EXPECT_EQ(brisk::background_pause(), 1u) << "brisk-bg did not start";
    brisk::background_resume();
  }
  if (!LeakScanPossible()) GTEST_SKIP() << "another thread runs: no scan";
  constexpr size_t kPage = 4096;
  auto* guarded = static_cast<char*>(brisk_aligned_alloc(kPage, 4 * kPage));
  ASSERT_NE(guarded, nullptr);
  ASSERT_EQ(mprotect(guarded + kPage, kPage, PROT_NONE), 0);
  g_reachable_root = reinterpret_cast<Node*>(guarded);
  brisk::debug::LeakSummary sum{};
  brisk::debug::report_leaks(brisk::debug::LeakScope::kUnreachable, &sum);
  ASSERT_EQ(mprotect(guarded + kPage, kPage, PROT_READ | PROT_WRITE), 0);
  EXPECT_TRUE(sum.scanned);
  EXPECT_GE(sum.reachable_blocks, 1u);
  EXPECT_EQ(Reports().find("TheLeakScanSkipsPages"), std::string::npos) << Reports();
  g_reachable_root = nullptr;
  brisk_free(guarded);
}

// While another thread runs (it could unmap memory under the scan) reachability is not told:
// every live block is listed, and the report says why.
TEST_F(DebugMode, TheLeakReportListsEveryLiveBlockWhileAnotherThreadRuns) {
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  KeepReachable();
  brisk::debug::LeakSummary sum{};
  brisk::debug::report_leaks(brisk::debug::LeakScope::kUnreachable, &sum);
  stop = true;
  other.join();
  EXPECT_FALSE(sum.scanned);
  std::string r = Reports();
  EXPECT_NE(r.find("KeepReachable"), std::string::npos) << r;
  EXPECT_NE(r.find("other threads still run at exit"), std::string::npos) << r;
  brisk_free(g_reachable_root->next);
  brisk_free(g_reachable_root);
  g_reachable_root = nullptr;
}

}  // namespace
