// Realloc chains: a shared set of buffers, each growing from 8 B to 1 MiB in uneven steps and
// then starting over. Threads pick buffers at random, so consecutive steps of one buffer run on
// different threads: realloc of a block another thread allocated or last reallocated, across
// every size-class boundary and into the large-block range. A chain starts with calloc one time
// in three, checked to be zero.
//
// Each buffer draws its sizes from its own generator, so the size sequence of every chain
// depends only on --seed, whichever thread performs each step.
#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "realloc";
constexpr std::size_t kStartSize = 8;
constexpr std::size_t kEndSize = 1 << 20;
constexpr int kBuffersPerThread = 8;

struct Chain {
  std::atomic_flag busy = ATOMIC_FLAG_INIT;
  Rng rng{0, 0};
  Block block;
  std::uint32_t index = 0;
  std::uint64_t generation = 0;
};

// One step of a chain: start, grow, or (at 1 MiB) check, free and reset. Returns the op count.
std::uint64_t step(Chain& chain, std::uint64_t base) {
  Block& b = chain.block;
  if (b.ptr == nullptr) {
    b.size = kStartSize;
    b.id = BlockId{chain.index, chain.generation, 0};
    b.hash = pattern_hash(base, b.id);
    const bool zeroed = chain.generation % 3 == 0;
    b.ptr = zeroed ? std::calloc(1, b.size) : std::malloc(b.size);
    if (b.ptr == nullptr) fail_verify(kName, b.id, 0, "allocation returned NULL");
    if (zeroed) verify_zero(kName, b, "after calloc");
    fill_pattern(b);
    return 1;
  }
  if (b.size >= kEndSize) {
    verify_pattern(kName, b, "before free");
    std::free(b.ptr);
    b = Block{};
    ++chain.generation;
    return 1;
  }
  // Uneven steps: grow by 1/16 to 1/2 of the size plus up to 100 odd bytes, so chains cross
  // size classes at unaligned sizes and sometimes land exactly on 1 MiB.
  const std::size_t grow = b.size / 16 + chain.rng.below(b.size / 2 - b.size / 16 + 1) +
                           chain.rng.between(1, 100);
  const std::size_t next = b.size + grow > kEndSize ? kEndSize : b.size + grow;
  b = verified_realloc(kName, b, next);
  return 1;
}

}  // namespace

void run_realloc_chains(Context& ctx) {
  const int threads = ctx.threads();
  const std::uint64_t steps_per_thread = ctx.scaled(20000, 500, 200);
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  const std::size_t chain_count = static_cast<std::size_t>(threads) * kBuffersPerThread;

  ctx.progress.begin("realloc x" + std::to_string(threads), steps_per_thread * threads);
  ctx.recorder.measure(kName, threads, [&] {
    std::vector<Chain> chains(chain_count);
    for (std::size_t i = 0; i < chain_count; ++i) {
      chains[i].index = static_cast<std::uint32_t>(i);
      chains[i].rng = Rng(ctx.options.seed, 0x7EA11ull << 32 | i);
    }
    std::atomic<std::uint64_t> ops{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        Rng pick(ctx.options.seed, 0x9000 + t);
        std::uint64_t mine = 0;
        for (std::uint64_t s = 0; s < steps_per_thread; ++s) {
          Chain* chain;
          do {
            chain = &chains[pick.below(chain_count)];
          } while (chain->busy.test_and_set(std::memory_order_acquire));
          mine += step(*chain, base);
          chain->busy.clear(std::memory_order_release);
          if (s % 64 == 63) ctx.progress.advance(64);
        }
        ops.fetch_add(mine);
      });
    }
    for (std::thread& th : pool) th.join();
    std::uint64_t total = ops.load();
    for (Chain& chain : chains) {
      if (chain.block.ptr == nullptr) continue;
      verify_pattern(kName, chain.block, "before free");
      std::free(chain.block.ptr);
      ++total;
    }
    return total;
  },
  std::to_string(chain_count) + " chains, 8 B to 1 MiB");
  ctx.progress.end();
}

}  // namespace brisk::stress
