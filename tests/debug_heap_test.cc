// A debug heap's spans (threadcache/debug_switch.h): it keeps every span that holds one of its
// blocks, quarantined ones included, and a span that empties goes to its class's central pool
// kept whole, as a thread heap's does (threadcache/span_pages.cc, heap_keep_empty_span). Run with
// BRISK_DEBUG_QUARANTINE=64m (no block leaves the quarantine unless a test takes it out) and
// BRISK_BACKGROUND=0 (no pass gives a kept span back meanwhile).
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

#include "core/chunk.h"
#include "core/size_class.h"
#include "debug/block_layout.h"
#include "debug/quarantine.h"
#include "tests/debug_mode_fixture.h"
#include "threadcache/heap.h"
#include "threadcache/orphans.h"

namespace brisk {
namespace {

Span* span_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return chunk_of(a)->span_of(a);
}

// Takes every block out of the quarantine on the calling thread, as brisk_trim does, but without
// the trim's give-back of the kept spans.
void EmptyTheQuarantine() {
  debug::QuarantinedBlock out[64];
  for (unsigned i = 0; i < debug::Quarantine::kShards; ++i) {
    while (std::size_t n = debug::g_quarantine.drain_shard(i, out, 64)) debug::leave_quarantine_all(out, n);
  }
}

using DebugHeapSpans = DebugMode;

// A debug block's span stays its debug heap's while the block waits in the quarantine; once the
// block leaves it, the emptied span is kept whole in its class's pool, owned by the orphan heap,
// for the next span of its class (a debug heap's or a thread heap's). Before, it went back to its
// chunk, where the debug heap's next new span took its pages and, with BRISK_PURGE_SPAN_TAILS,
// gave the written ones back to the OS, to fault them in again as it carved.
TEST_F(DebugHeapSpans, ASpanThatEmptiesIsKeptWholeForItsClass) {
  std::thread([] {
    void* blocks[3];
    for (void*& p : blocks) p = brisk_malloc(40 * 1024);
    void* other = brisk_malloc(20 * 1024);  // the class refilled last is another (heap_cycles_class)
    Span* s[2] = {span_of(blocks[0]), span_of(blocks[1])};
    ASSERT_NE(s[0], s[1]);
    ASSERT_EQ(kClasses[s[0]->size_class].capacity, 1u) << "a class of one block a span";
    ASSERT_NE(span_of(other)->size_class, s[0]->size_class);
    Heap* debug_heap = s[0]->owner.load();
    ASSERT_TRUE(debug_heap->is_debug);
    std::memset(blocks[0], 0x5a, 40 * 1024);
    brisk_free(blocks[0]);
    brisk_free(blocks[1]);
    for (Span* span : s) {
      EXPECT_FALSE(span->kept) << "a span whose block is quarantined left its debug heap";
      EXPECT_EQ(span->owner.load(), debug_heap);
    }
    EmptyTheQuarantine();
    for (Span* span : s) {
      EXPECT_TRUE(span->kept) << "the emptied span went back to its chunk";
      EXPECT_EQ(span->owner.load(), &g_orphan_heap);
      EXPECT_EQ(span->carved_blocks, 0u);
    }
    brisk_free(blocks[2]);
    brisk_free(other);
  }).join();
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

}  // namespace
}  // namespace brisk
