// Larson-style bleeding (after Larson and Krishnan's server benchmark): a shared pool of blocks
// is split into one slice per lane. A lane's thread replaces random slots of its slice (verify,
// free, allocate a new size, fill) and then hands the slice to a new thread and exits. Each
// generation thus frees blocks its predecessor allocated, after that predecessor has exited:
// an allocator that ties blocks to their owner thread's lifetime leaks or breaks here.
#include <cstdlib>
#include <thread>
#include <vector>

#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "larson";
constexpr std::size_t kSlotsPerLane = 1000;
constexpr std::uint64_t kReplacementsPerGeneration = 5000;

struct Lane {
  std::uint32_t index = 0;
  std::uint64_t generations = 0;
  std::uint64_t base = 0;
  std::vector<Block> slots;
  // threads[g] runs generation g; it is written by generation g-1 before that thread exits, so
  // joining threads[g-1] makes threads[g] visible to the joiner.
  std::vector<std::thread> threads;
};

std::size_t larson_size(Rng& rng) {
  // Larson's classic range is 10..1000 bytes; one in 64 is bigger to cross size-class families.
  return rng.below(64) == 0 ? rng.between(1001, 64 * 1024) : rng.between(10, 1000);
}

Block new_block(Lane& lane, Rng& rng, std::uint64_t iteration, std::uint32_t slot) {
  Block b;
  b.size = larson_size(rng);
  b.id = BlockId{lane.index, iteration, slot};
  b.hash = pattern_hash(lane.base, b.id);
  b.ptr = std::malloc(b.size);
  if (b.ptr == nullptr) fail_verify(kName, b.id, 0, "malloc returned NULL");
  fill_pattern(b);
  return b;
}

void run_generation(Context& ctx, Lane& lane, std::uint64_t generation) {
  Rng rng(ctx.options.seed, (std::uint64_t{lane.index} << 32) | generation);
  if (generation == 0) {
    lane.slots.resize(kSlotsPerLane);
    for (std::uint32_t s = 0; s < kSlotsPerLane; ++s) lane.slots[s] = new_block(lane, rng, 0, s);
  }
  for (std::uint64_t k = 0; k < kReplacementsPerGeneration; ++k) {
    const auto s = static_cast<std::uint32_t>(rng.below(kSlotsPerLane));
    verify_pattern(kName, lane.slots[s], "before free by a later thread");
    std::free(lane.slots[s].ptr);
    lane.slots[s] = new_block(lane, rng, 1 + generation * kReplacementsPerGeneration + k, s);
  }
  ctx.progress.advance(1);
  if (generation + 1 < lane.generations) {
    lane.threads[generation + 1] = std::thread([&ctx, &lane, generation] {
      run_generation(ctx, lane, generation + 1);
    });
    return;  // this thread exits; its blocks live on in the slice
  }
  for (Block& b : lane.slots) {
    verify_pattern(kName, b, "before free");
    std::free(b.ptr);
  }
}

}  // namespace

void run_larson(Context& ctx) {
  const int lanes = ctx.threads();
  const std::uint64_t generations = ctx.scaled(100, 3, 3);
  ctx.progress.begin("larson x" + std::to_string(lanes), generations * lanes);
  ctx.recorder.measure(kName, lanes, [&] {
    std::vector<Lane> all(static_cast<std::size_t>(lanes));
    for (int i = 0; i < lanes; ++i) {
      all[i].index = static_cast<std::uint32_t>(i);
      all[i].generations = generations;
      all[i].base = workload_base(ctx.options.seed, kName);
      all[i].threads.resize(generations);
    }
    for (Lane& lane : all) lane.threads[0] = std::thread([&ctx, &lane] { run_generation(ctx, lane, 0); });
    for (Lane& lane : all)
      for (std::thread& t : lane.threads) t.join();  // in order: see Lane::threads
    return static_cast<std::uint64_t>(lanes) *
           (2 * kSlotsPerLane + 2 * generations * kReplacementsPerGeneration);
  },
  std::to_string(generations) + " generations per lane");
  ctx.progress.end();
}

}  // namespace brisk::stress
