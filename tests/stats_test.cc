// The statistics of brisk_get_stats, brisk_get_class_stats, brisk_get_thread_stats and
// brisk_print_stats: after a known sequence of allocations in a fresh thread every counter
// equals the known total; remote frees are counted from the free to the owner's drain; the JSON
// output parses; and reading the statistics while threads allocate and free is sound (the TSan
// build runs this too).
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/platform.h"
#include "tests/test_util.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"

namespace {

using brisk_test::Stats;

constexpr size_t kClass1024 = 31;  // block size 1024: 64 blocks per 64 KiB span (README table)
constexpr uint64_t kBlocksPer1024Span = 64;

std::vector<brisk_class_stats> ClassStats() {
  std::vector<brisk_class_stats> v(BRISK_SIZE_CLASSES);
  EXPECT_EQ(brisk_get_class_stats(v.data(), v.size()), size_t{BRISK_SIZE_CLASSES});
  return v;
}

uint64_t ThisThreadId() { return static_cast<uint64_t>(syscall(SYS_gettid)); }

// This thread's entry of brisk_get_thread_stats; heap_id 0 if it has no heap.
brisk_thread_stats ThreadStats(uint64_t tid) {
  std::vector<brisk_thread_stats> v(4096);
  size_t n = brisk_get_thread_stats(v.data(), v.size());
  for (size_t i = 0; i < n && i < v.size(); ++i)
    if (v[i].thread_id == tid) return v[i];
  return brisk_thread_stats{};
}

TEST(Stats, CountersEqualTheKnownTotalsOfAFreshThread) {
  constexpr uint64_t kSmall = 1000;  // class 31: 16 spans, 24 blocks of room in the last
  constexpr int kLarge = 3;
  constexpr int kMedium = 2;
  brisk_stats before = Stats();
  std::vector<brisk_class_stats> classes_before = ClassStats();
  std::vector<void*> small;
  std::thread worker([&] {
    uint64_t tid = ThisThreadId();
    EXPECT_EQ(ThreadStats(tid).heap_id, 0u) << "a fresh thread has no heap";
    for (uint64_t i = 0; i < kSmall; ++i) small.push_back(brisk_malloc(1000));
    std::vector<void*> large, medium;
    uint64_t large_usable = 0, medium_usable = 0;
    for (int i = 0; i < kLarge; ++i) {
      large.push_back(brisk_malloc(3 << 20));
      large_usable += brisk_usable_size(large.back());
    }
    for (int i = 0; i < kMedium; ++i) {
      medium.push_back(brisk_malloc(100 << 10));
      medium_usable += brisk_usable_size(medium.back());
    }

    brisk_stats s = Stats();
    std::vector<brisk_class_stats> k = ClassStats();
    const uint64_t spans = (kSmall + kBlocksPer1024Span - 1) / kBlocksPer1024Span;
    const uint64_t room = spans * kBlocksPer1024Span - kSmall;
    EXPECT_EQ(k[kClass1024].block_size, 1024u);
    EXPECT_EQ(k[kClass1024].live_blocks - classes_before[kClass1024].live_blocks, kSmall);
    EXPECT_EQ(k[kClass1024].spans - classes_before[kClass1024].spans, spans);
    EXPECT_EQ(k[kClass1024].free_blocks - classes_before[kClass1024].free_blocks, room);
    EXPECT_EQ(s.small_live_blocks - before.small_live_blocks, kSmall);
    EXPECT_EQ(s.small_bytes_in_use - before.small_bytes_in_use, kSmall * 1024);
    EXPECT_EQ(s.medium_live_blocks - before.medium_live_blocks, uint64_t{kMedium});
    EXPECT_EQ(s.medium_bytes_in_use - before.medium_bytes_in_use, medium_usable);
    EXPECT_EQ(s.large_live_blocks - before.large_live_blocks, uint64_t{kLarge});
    EXPECT_EQ(s.large_bytes_in_use - before.large_bytes_in_use, large_usable);
    EXPECT_EQ(s.bytes_in_use - before.bytes_in_use, kSmall * 1024 + medium_usable + large_usable);
    EXPECT_EQ(s.thread_cache_bytes - before.thread_cache_bytes, room * 1024);
    EXPECT_EQ(s.central_pool_bytes, before.central_pool_bytes);
    EXPECT_EQ(s.remote_queued_bytes, 0u);
    EXPECT_EQ(s.bytes_mapped, s.chunk_bytes_mapped + s.large_bytes_mapped);
    EXPECT_GE(s.large_bytes_mapped - s.large_bytes_cached, large_usable);
    EXPECT_GT(s.bytes_resident, 0u);
    EXPECT_GT(s.process_rss_bytes, 0u);
    brisk_thread_stats t = ThreadStats(tid);
    EXPECT_NE(t.heap_id, 0u);
    EXPECT_EQ(t.cache_bytes, room * 1024);
    EXPECT_EQ(t.remote_frees_sent, 0u);
    EXPECT_EQ(t.remote_frees_received, 0u);

    // Every other small block back: no span empties, so the freed blocks stay in the cache.
    for (uint64_t i = 0; i < kSmall; i += 2) brisk_free(small[i]);
    for (void* p : large) brisk_free(p);
    for (void* p : medium) brisk_free(p);
    s = Stats();
    k = ClassStats();
    EXPECT_EQ(k[kClass1024].live_blocks - classes_before[kClass1024].live_blocks, kSmall / 2);
    EXPECT_EQ(k[kClass1024].free_blocks - classes_before[kClass1024].free_blocks, room + kSmall / 2);
    EXPECT_EQ(k[kClass1024].spans - classes_before[kClass1024].spans, spans);
    EXPECT_EQ(s.bytes_in_use - before.bytes_in_use, kSmall / 2 * 1024);
    EXPECT_EQ(s.large_live_blocks, before.large_live_blocks);
    EXPECT_EQ(s.large_bytes_in_use, before.large_bytes_in_use);
    EXPECT_EQ(s.medium_live_blocks, before.medium_live_blocks);
    // The medium blocks' runs (two 64 KiB pages each) stay in the thread's medium cache (2 MiB
    // or more in every mode, unless BRISK_MEDIUM_CACHE_BYTES=0).
    const bool cache = brisk::options::get(brisk::options::Id::kMediumCacheBytes) != 0;
    const uint64_t medium_cached = cache ? kMedium * (128u << 10) : 0;
    EXPECT_EQ(s.thread_cache_bytes - before.thread_cache_bytes, (room + kSmall / 2) * 1024 + medium_cached);
    EXPECT_EQ(ThreadStats(tid).cache_bytes, (room + kSmall / 2) * 1024 + medium_cached);
  });
  worker.join();

  // The thread's spans went to the central pools with their live blocks.
  brisk_stats s = Stats();
  EXPECT_EQ(s.bytes_in_use - before.bytes_in_use, kSmall / 2 * 1024);
  EXPECT_EQ(s.central_pool_bytes - before.central_pool_bytes,
            ((kSmall + kBlocksPer1024Span - 1) / kBlocksPer1024Span * kBlocksPer1024Span - kSmall / 2) * 1024);
  EXPECT_EQ(s.thread_cache_bytes, before.thread_cache_bytes);
  EXPECT_EQ(s.heaps_live, before.heaps_live);

  for (uint64_t i = 1; i < kSmall; i += 2) brisk_free(small[i]);
  brisk_thread_collect();
  s = Stats();
  std::vector<brisk_class_stats> k = ClassStats();
  EXPECT_EQ(s.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(s.central_pool_bytes, before.central_pool_bytes);
  EXPECT_EQ(k[kClass1024].live_blocks, classes_before[kClass1024].live_blocks);
  EXPECT_EQ(s.remote_queued_bytes, 0u);
}

// Blocks a thread frees into another live thread's spans are in flight from the free until the
// owner takes them from its queue: out of bytes_in_use, in remote_queued_bytes, counted as sent
// by the one thread and as received by the other.
TEST(Stats, RemoteFreesAreCountedFromTheFreeToTheOwnersDrain) {
  constexpr int kBlocks = 100;
  std::vector<void*> blocks;
  std::atomic<int> step{0};
  uint64_t owner_tid = 0;
  brisk_stats base{};
  std::thread owner([&] {
    owner_tid = ThisThreadId();
    brisk_free(brisk_malloc(64));  // the heap exists before the baseline
    base = Stats();
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(64));
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    brisk_thread_collect();  // takes what was sent
    step = 3;
    while (step.load() != 4) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  EXPECT_EQ(Stats().bytes_in_use - base.bytes_in_use, uint64_t{kBlocks} * 64);
  std::thread freer([&] {
    uint64_t tid = ThisThreadId();
    // Its own heap, so its frees of the owner's blocks are remote; of another class than theirs,
    // which its foreign cache (threadcache/foreign_cache.h) would keep.
    brisk_free(brisk_malloc(16));
    for (void* p : blocks) brisk_free(p);
    brisk_stats s = Stats();
    EXPECT_EQ(s.bytes_in_use, base.bytes_in_use);
    EXPECT_EQ(s.remote_queued_bytes - base.remote_queued_bytes, uint64_t{kBlocks} * 64);
    EXPECT_EQ(ThreadStats(tid).remote_frees_sent, uint64_t{kBlocks});
    EXPECT_EQ(ThreadStats(owner_tid).remote_frees_received, 0u);
    brisk_thread_collect();  // sends its partial batch
    EXPECT_EQ(Stats().remote_queued_bytes - base.remote_queued_bytes, uint64_t{kBlocks} * 64);
    step = 2;
    while (step.load() != 3) std::this_thread::yield();
    brisk_stats after = Stats();
    EXPECT_EQ(after.remote_queued_bytes, base.remote_queued_bytes);
    EXPECT_EQ(after.bytes_in_use, base.bytes_in_use);
    EXPECT_EQ(ThreadStats(owner_tid).remote_frees_received, uint64_t{kBlocks});
    step = 4;
  });
  freer.join();
  owner.join();
}

// Large blocks and remote frees are counted on striped counters (core/stats.h): threads that
// allocate at once, then free each other's blocks at once, leave totals that are exact once
// they are done, though each block is counted on one thread's stripe and uncounted on another.
TEST(Stats, BlocksThatThreadsFreeForEachOtherAtOnceAreCountedExactly) {
  constexpr unsigned kThreads = 8;
  constexpr int kLarge = 8;
  constexpr int kSmall = 640 / brisk_test::kScale;  // ten batches of 64 blocks to the neighbour
  const brisk_stats before = Stats();
  std::vector<std::vector<void*>> blocks(kThreads);
  std::atomic<uint64_t> large_usable{0};
  std::barrier step(kThreads + 1);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLarge; ++i) {
        blocks[t].push_back(brisk_malloc(3 << 20));
        large_usable += brisk_usable_size(blocks[t].back());
      }
      for (int i = 0; i < kSmall; ++i) blocks[t].push_back(brisk_malloc(64));
      step.arrive_and_wait();  // all allocated: main reads
      step.arrive_and_wait();
      for (void* p : blocks[(t + 1) % kThreads]) brisk_free(p);
      brisk_thread_collect();  // sends the partial batch
      step.arrive_and_wait();
      brisk_thread_collect();  // takes what the neighbour sent
      step.arrive_and_wait();  // all taken: main reads
      step.arrive_and_wait();
    });
  }
  step.arrive_and_wait();
  brisk_stats s = Stats();
  EXPECT_EQ(s.large_live_blocks - before.large_live_blocks, uint64_t{kThreads} * kLarge);
  EXPECT_EQ(s.large_bytes_in_use - before.large_bytes_in_use, large_usable.load());
  step.arrive_and_wait();
  step.arrive_and_wait();
  step.arrive_and_wait();
  s = Stats();
  EXPECT_EQ(s.large_live_blocks, before.large_live_blocks);
  EXPECT_EQ(s.large_bytes_in_use, before.large_bytes_in_use);
  EXPECT_EQ(s.remote_queued_bytes, before.remote_queued_bytes);
  EXPECT_EQ(s.bytes_mapped, s.chunk_bytes_mapped + s.large_bytes_mapped);
  EXPECT_LE(s.large_bytes_cached, s.large_bytes_mapped);
  step.arrive_and_wait();
  for (auto& t : threads) t.join();
}

// A JSON checker for what brisk_print_stats writes: objects, arrays, strings without escapes,
// unsigned numbers. Records each key with its number (an object's key with "{").
class Json {
 public:
  explicit Json(const std::string& s) : s_(s) {}
  bool Parse() {
    bool ok = Value("");
    Space();
    return ok && i_ == s_.size();
  }
  bool Has(const std::string& key) const { return keys_.find("\"" + key + "\"=") != std::string::npos; }
  size_t Count(const std::string& key) const {
    size_t n = 0;
    for (size_t at = keys_.find("\"" + key + "\"="); at != std::string::npos; at = keys_.find("\"" + key + "\"=", at + 1))
      ++n;
    return n;
  }

 private:
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"' && s_[i_] != '\\') ++i_;
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    *out = s_.substr(start, i_ - start);
    ++i_;
    return true;
  }
  bool Value(const std::string& key) {
    Space();
    if (i_ >= s_.size()) return false;
    if (s_[i_] == '{') {
      ++i_;
      if (!key.empty()) keys_ += "\"" + key + "\"={;";
      if (Eat('}')) return true;
      do {
        std::string k;
        if (!String(&k) || !Eat(':') || !Value(k)) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (s_[i_] == '[') {
      ++i_;
      if (Eat(']')) return true;
      do {
        if (!Value("")) return false;
      } while (Eat(','));
      return Eat(']');
    }
    size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ == start) return false;
    keys_ += "\"" + key + "\"=" + s_.substr(start, i_ - start) + ";";
    return true;
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string keys_;
};

std::string Printed(int json) {
  FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return "";
  std::fputs("before ", f);  // buffered: brisk_print_stats must flush it before its own write
  brisk_print_stats(f, json);
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  EXPECT_EQ(text.rfind("before ", 0), 0u) << "the stream's buffered text came after the statistics";
  return text.substr(7);
}

// bytes_resident is documented as an upper bound of brisk's share of the RSS. A small span
// that claims pages which held data (a freed, written medium block's: resident pages are
// claimed first) keeps them resident past its carved part until carving reaches them; they
// stay counted (they dropped out of the estimate: 37-54 MiB of balanced realloc's peak).
TEST(Stats, BytesResidentCountsTheResidentPagesPastASmallSpansCarvedPart) {
  constexpr size_t kBlock = 16 * 1024;  // a class with 2-page spans
  constexpr size_t kMedium = brisk::kClasses[brisk::size_to_class_compute(kBlock)].span_pages * brisk::kPageSize;  // its span
  static_assert(kMedium > brisk::kSmallMax, "a medium block takes the span's pages first");
  if (brisk_get_strategy() == BRISK_STRATEGY_LOW_MEMORY) GTEST_SKIP() << "low-memory gives span tails back";
  std::thread([] {
    void* m = brisk_malloc(kMedium);
    ASSERT_NE(m, nullptr);
    std::memset(m, 1, kMedium);
    brisk_free(m);
    {  // out of the thread's medium cache: free pages that held data, resident
      brisk::HeapSlowLock lock(brisk::t_heap);
      brisk::medium_cache_flush(brisk::t_heap);
    }
    const brisk_stats before = Stats();
    void* b = brisk_malloc(kBlock);
    ASSERT_NE(b, nullptr);
    // The span took those pages: what it has not carved yet is still resident.
    ASSERT_GE(brisk_test::ResidentIn({static_cast<char*>(b) + kBlock}, kMedium - kBlock), kMedium - 2 * kBlock);
    const brisk_stats after = Stats();
    EXPECT_GE(after.bytes_resident + kBlock, before.bytes_resident)
        << "before " << (before.bytes_resident >> 10) << " KiB, after " << (after.bytes_resident >> 10) << " KiB";
    brisk_free(b);
  }).join();
}

// large_cache_resident_bytes counts the pages of the cached mappings that are resident when the
// statistics are read, not their sizes: a 32 MiB block written in its first MiB and freed into
// the cache counted 32 MiB, more than the process's RSS grew (brisk-stress --peak-breakdown put
// 71 MiB of prodcons's 66 MiB peak in the large cache).
TEST(Stats, LargeCacheResidentBytesCountsThePagesAFreedBlockWrote) {
  static constexpr size_t kBlock = size_t{32} << 20;
  static constexpr size_t kWritten = size_t{1} << 20;
  if (brisk_get_strategy() == BRISK_STRATEGY_LOW_MEMORY) GTEST_SKIP() << "low-memory decays a freed mapping within 10 ms";
  std::thread([] {
    brisk_trim();  // the cache empty: only this block's pages count
    ASSERT_EQ(Stats().large_cache_resident_bytes, 0u);
    auto* p = static_cast<char*>(brisk_malloc(kBlock));
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, kWritten);
    brisk_free(p);
    const brisk_stats s = Stats();
    ASSERT_GE(s.large_bytes_cached, kBlock) << "the freed mapping is in the cache";
    EXPECT_GE(s.large_cache_resident_bytes, kWritten);
    // Huge pages (transparent_hugepage=always) may make up to 2 MiB of each written MiB resident.
    EXPECT_LT(s.large_cache_resident_bytes, kBlock / 4);
    brisk_trim();
  }).join();
}

// brisk_stats grows at its end only: a program built against an older brisk.h (a smaller
// struct) must get its fields and nothing written past them, and the function symbol itself,
// which programs built before brisk_get_stats_sized call, writes the fields it always wrote.
TEST(Stats, AnOlderOrNewerCallersStatsAreWrittenOnlyAsFarAsItsSize) {
  constexpr unsigned char kUntouched = 0xA5;
  struct Bigger {
    brisk_stats stats;
    std::uint64_t newer_field;  // a field a newer brisk.h might append
  };
  Bigger big;
  std::memset(&big, kUntouched, sizeof big);
  EXPECT_EQ(brisk_get_stats_sized(&big.stats, sizeof big), sizeof(brisk_stats));
  std::uint64_t untouched;
  std::memset(&untouched, kUntouched, sizeof untouched);
  EXPECT_EQ(big.newer_field, untouched) << "written past the library's brisk_stats";
  EXPECT_NE(big.stats.heaps_live, untouched);
  EXPECT_NE(big.stats.kept_span_bytes, untouched);

  // An older brisk.h's struct: the first 12 fields (up to chunk_bytes_cached).
  constexpr std::size_t kOlder = offsetof(brisk_stats, chunk_bytes_cached) + sizeof(std::uint64_t);
  std::memset(&big, kUntouched, sizeof big);
  EXPECT_EQ(brisk_get_stats_sized(&big.stats, kOlder), sizeof(brisk_stats));
  EXPECT_NE(big.stats.heaps_live, untouched);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&big);
  for (std::size_t i = kOlder; i < sizeof big; ++i) ASSERT_EQ(bytes[i], kUntouched) << "byte " << i;

  // The symbol: every field up to kept_span_bytes, nothing past it.
  std::memset(&big, kUntouched, sizeof big);
  (brisk_get_stats)(&big.stats);
  constexpr std::size_t kUnsized = offsetof(brisk_stats, kept_span_bytes) + sizeof(std::uint64_t);
  EXPECT_NE(big.stats.process_rss_bytes, untouched);
  for (std::size_t i = kUnsized; i < sizeof big; ++i) ASSERT_EQ(bytes[i], kUntouched) << "byte " << i;
  // And through the macro, the caller's whole struct.
  std::memset(&big, kUntouched, sizeof big);
  brisk_get_stats(&big.stats);
  EXPECT_NE(big.stats.kept_span_bytes, untouched);
  EXPECT_EQ(big.newer_field, untouched);
  EXPECT_EQ(brisk_get_stats_sized(nullptr, sizeof(brisk_stats)), sizeof(brisk_stats));
}

// Carving new spans makes fresh OS pages present, and the statistics say how: the populate
// calls made so far and what each way has cost (core/page_cost.h). With BRISK_POPULATE=0 neither
// is measured.
TEST(Stats, ReportHowCarvingMadeFreshPagesPresent) {
  std::thread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < 64 * 1024; ++i) blocks.push_back(brisk_malloc(48));  // 3 MiB of carving
    brisk_stats s;
    brisk_get_stats(&s);
    if (std::getenv("BRISK_POPULATE") != nullptr && std::strcmp(std::getenv("BRISK_POPULATE"), "0") == 0) {
      EXPECT_EQ(s.page_fault_ns + s.page_populate_ns, 0u);
    } else {
      // One fresh page in 16 takes the way not chosen, so both have been measured.
      EXPECT_GT(s.page_fault_ns, 0u);
      namespace platform = brisk::platform;
      constexpr std::size_t kPage = brisk::kOsPageSize;
      void* probe = platform::map(kPage);  // populate refused (a seccomp filter): never measured
      if (probe != nullptr && platform::populate(probe, kPage)) {
        EXPECT_GT(s.page_populate_ns, 0u);
      }
      if (probe != nullptr) platform::unmap(probe, kPage);
      EXPECT_LT(s.page_fault_ns, 1000000000u);  // a page in under a second
    }
    brisk_stats again;
    brisk_get_stats(&again);
    EXPECT_GE(again.os_populate_calls, s.os_populate_calls);
    for (void* p : blocks) brisk_free(p);
  }).join();
}

TEST(Stats, JsonOutputParsesAndNamesEveryField) {
  std::vector<void*> live;
  for (int i = 0; i < 50; ++i) live.push_back(brisk_malloc(static_cast<size_t>(16 + 300 * i)));
  std::string text = Printed(1);
  Json json(text);
  ASSERT_TRUE(json.Parse()) << text;
  for (const char* field : {"chunks_mapped", "chunk_bytes_cached", "bytes_in_use", "small_bytes_in_use",
                            "medium_bytes_in_use", "large_bytes_in_use", "small_live_blocks", "medium_live_blocks",
                            "thread_cache_bytes", "central_pool_bytes", "remote_queued_bytes",
                            "large_cache_resident_bytes", "chunk_bytes_free", "chunk_bytes_free_resident",
                            "bytes_mapped", "bytes_resident", "process_rss_bytes", "kept_span_bytes",
                            "os_populate_calls", "page_fault_ns", "page_populate_ns",
                            "thread_count"})
    EXPECT_EQ(json.Count(field), 1u) << field << " in\n" << text;
  EXPECT_GE(json.Count("block_size"), 2u) << text;  // the classes in use
  EXPECT_GE(json.Count("heap_id"), 1u) << text;     // this thread
  std::vector<brisk_class_stats> k = ClassStats();
  size_t classes_in_use = 0;
  for (const auto& c : k) classes_in_use += c.spans != 0 || c.live_blocks != 0;
  EXPECT_EQ(json.Count("block_size"), classes_in_use);
  EXPECT_EQ(json.Count("locks"), 1u) << text;
  for (const char* name : {"central pools", "medium pool", "chunk registry", "chunk cache", "abandoned chunks",
                           "large cache", "heap pool", "heap slow locks", "background pass", "orphan queue"})
    EXPECT_EQ(json.Count(name), 1u) << name << " in\n" << text;
  EXPECT_EQ(json.Count("acquisitions"), size_t{BRISK_LOCK_STRUCTURES}) << text;
  EXPECT_EQ(json.Count("contended"), size_t{BRISK_LOCK_STRUCTURES}) << text;

  std::string table = Printed(0);
  EXPECT_NE(table.find("bytes_in_use"), std::string::npos) << table;
  EXPECT_NE(table.find("size classes"), std::string::npos) << table;
  EXPECT_NE(table.find("central pools"), std::string::npos) << table;
  EXPECT_NE(table.find("orphan queue"), std::string::npos) << table;
  EXPECT_FALSE(Json(table).Parse());  // the checker can fail

  // A stream without a descriptor gets the same text.
  char* mem = nullptr;
  size_t mem_size = 0;
  FILE* f = open_memstream(&mem, &mem_size);
  ASSERT_NE(f, nullptr);
  brisk_print_stats(f, 1);
  std::fclose(f);
  std::string from_memory(mem, mem_size);
  std::free(mem);
  EXPECT_TRUE(Json(from_memory).Parse()) << from_memory;
  for (void* p : live) brisk_free(p);
}

// Readers walk every chunk's span descriptors while their owners allocate and free, locally and
// remotely: under TSan this shows whether every field the walk reads is written atomically.
TEST(Stats, ReadingWhileTwoThreadsAllocateAndFreeIsSound) {
  const int kRounds = 400 / brisk_test::kScale;
  std::atomic<bool> done{false};
  std::atomic<void*> handoff[64] = {};
  auto work = [&](uint64_t seed) {
    brisk_test::Rng rng(seed);
    std::vector<void*> mine;
    for (int round = 0; round < kRounds; ++round) {
      for (int i = 0; i < 64; ++i) mine.push_back(brisk_malloc(brisk_test::MixedSize(rng)));
      for (auto& slot : handoff) {  // trade blocks with the other thread: remote frees
        void* theirs = slot.exchange(mine.back());
        mine.pop_back();
        if (theirs != nullptr) brisk_free(theirs);
      }
      while (mine.size() > 32) {
        brisk_free(mine.back());
        mine.pop_back();
      }
    }
    for (void* p : mine) brisk_free(p);
  };
  brisk_stats base = Stats();
  std::thread a(work, 1), b(work, 2);
  std::thread reader([&] {
    FILE* null = std::fopen("/dev/null", "w");
    ASSERT_NE(null, nullptr);
    int reads = 0;
    while (!done.load() || reads < 3) {
      brisk_stats s = Stats();
      EXPECT_LE(s.small_bytes_in_use, s.chunk_bytes_mapped);
      std::vector<brisk_class_stats> k = ClassStats();
      for (size_t i = 0; i < k.size(); ++i)
        EXPECT_LE(k[i].live_blocks + k[i].free_blocks, k[i].spans * brisk::kClasses[i].capacity) << "class " << i;
      brisk_thread_stats t[8];
      brisk_get_thread_stats(t, 8);
      brisk_print_stats(null, reads % 2);
      ++reads;
    }
    std::fclose(null);
  });
  a.join();
  b.join();
  done = true;
  reader.join();
  for (auto& slot : handoff)
    if (void* p = slot.exchange(nullptr)) brisk_free(p);
  brisk_thread_collect();
  brisk_stats s = Stats();
  EXPECT_EQ(s.bytes_in_use, base.bytes_in_use);
  EXPECT_EQ(s.remote_queued_bytes, 0u);
}

}  // namespace
