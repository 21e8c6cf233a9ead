// Large-block replacement: each thread keeps a few big blocks (256 KiB to 64 MiB, spread evenly
// over the powers of two, so small and huge blocks are equally common) and replaces one at
// random, again and again. One block in four is touched: a word written on every 4 KiB page,
// so its pages are resident, and checked before it is freed; the others are never touched, as
// in MMtest's large test as written. An allocator that gives freed pages back at once pays a
// page fault per page of every touched block; one that keeps them pays none.
//
// Runs on one thread, then on --threads threads, each with its own slots.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "large-replace";
constexpr std::size_t kSlotsPerThread = 8;
constexpr unsigned kMinLog = 18;  // 256 KiB
constexpr unsigned kMaxLog = 26;  // 64 MiB, exclusive
constexpr std::size_t kTouchPage = 4096;
constexpr std::uint64_t kWordStep = 0x9E3779B97F4A7C15ull;

struct Slot {
  Block block;
  bool touched = false;
};

std::size_t replace_size(Rng& rng) {
  const std::size_t octave = std::size_t{1} << rng.between(kMinLog, kMaxLog - 1);
  return octave + rng.below(octave);
}

// The word on page i of a touched block.
std::uint64_t page_word(const Block& b, std::size_t page) { return b.hash + page * kWordStep; }

void touch(const Block& b) {
  auto* bytes = static_cast<unsigned char*>(b.ptr);
  for (std::size_t page = 0; page * kTouchPage + 8 <= b.size; ++page) {
    const std::uint64_t w = page_word(b, page);
    std::memcpy(bytes + page * kTouchPage, &w, 8);
  }
}

void check(const Block& b) {
  const auto* bytes = static_cast<const unsigned char*>(b.ptr);
  for (std::size_t page = 0; page * kTouchPage + 8 <= b.size; ++page) {
    std::uint64_t w;
    std::memcpy(&w, bytes + page * kTouchPage, 8);
    if (w != page_word(b, page)) fail_verify(kName, b.id, page * kTouchPage, "page word changed before free");
  }
}

void release(Slot& slot) {
  if (slot.block.ptr == nullptr) return;
  if (slot.touched) check(slot.block);
  std::free(slot.block.ptr);
  slot = Slot{};
}

// One thread's run: returns its allocation operations (mallocs and frees).
std::uint64_t replace_loop(Context& ctx, std::uint64_t base, std::uint32_t task, std::uint64_t replacements) {
  Rng rng(ctx.options.seed, 0x1A26Eull << 32 | task);
  Slot slots[kSlotsPerThread];
  std::uint64_t ops = 0;
  for (std::uint64_t i = 0; i < replacements; ++i) {
    Slot& slot = slots[rng.below(kSlotsPerThread)];
    if (slot.block.ptr != nullptr) ++ops;
    release(slot);
    Block& b = slot.block;
    b.size = replace_size(rng);
    b.id = BlockId{task, i, 0};
    b.hash = pattern_hash(base, b.id);
    b.ptr = std::malloc(b.size);
    ++ops;
    if (b.ptr == nullptr) fail_verify(kName, b.id, 0, "malloc returned NULL");
    slot.touched = rng.below(4) == 0;
    if (slot.touched) touch(b);
    if (i % 16 == 15) ctx.progress.advance(16);
  }
  for (Slot& slot : slots) {
    if (slot.block.ptr != nullptr) ++ops;
    release(slot);
  }
  return ops;
}

void run_on(Context& ctx, int threads, std::uint64_t replacements) {
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  ctx.progress.begin(std::string(kName) + " x" + std::to_string(threads), replacements * threads);
  ctx.recorder.measure(kName, threads, [&] {
    std::atomic<std::uint64_t> ops{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { ops.fetch_add(replace_loop(ctx, base, static_cast<std::uint32_t>(t), replacements)); });
    for (std::thread& th : pool) th.join();
    return ops.load();
  },
  "8 slots per thread, 256 KiB to 64 MiB, 1 in 4 touched");
  ctx.progress.end();
}

}  // namespace

void run_large_replace(Context& ctx) {
  const std::uint64_t replacements = ctx.scaled(2000, 2);
  run_on(ctx, 1, replacements);
  if (ctx.threads() > 1) run_on(ctx, ctx.threads(), replacements);
}

}  // namespace brisk::stress
