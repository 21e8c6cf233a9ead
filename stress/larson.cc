// Larson-style bleeding (after Larson and Krishnan's server benchmark): a shared pool of blocks
// is split into one slice per lane. A lane's thread replaces random slots of its slice (verify,
// free, allocate a new size, fill) and then hands the slice to a new thread and exits. Each
// generation thus frees blocks its predecessor allocated, after that predecessor has exited:
// an allocator that ties blocks to their owner thread's lifetime leaks or breaks here.
//
// Two rows use it:
//   larson          1,000 slots per lane, 5,000 replacements per generation, 10..1000 B with
//                   one block in 64 up to 64 KiB; each lane's first thread allocates its slice;
//                   --threads lanes only.
//   larson-classic  larson as mimalloc-bench runs it (`larson 5 8 1000 5000 100 4141 N`, the
//                   C++ build): 5,000 slots per lane, 8..999 B, new[]/delete[], and a
//                   generation of `rounds` * 5,000 replacements, 100 rounds at --scale 100
//                   (--scale scales the rounds); the calling thread first allocates every
//                   slice, shuffles the blocks among the lanes and replaces 4 * lanes * 5,000
//                   random ones, so the first generation frees blocks another thread
//                   allocated. The original runs for 5 seconds; here each lane runs
//                   kClassicGenerations generations. One lane, then --threads lanes.
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

struct Params {
  const char* name;
  std::size_t slots_per_lane;
  std::size_t (*draw_size)(Rng&);
  bool classic;  // new[]/delete[] and the calling thread's warm-up, as in larson-classic above
};

std::size_t larson_size(Rng& rng) {
  // Larson's classic range is 10..1000 bytes; one in 64 is bigger to cross size-class families.
  return rng.below(64) == 0 ? rng.between(1001, 64 * 1024) : rng.between(10, 1000);
}

std::size_t classic_size(Rng& rng) { return rng.between(8, 999); }

constexpr Params kLarson{"larson", 1000, larson_size, false};
constexpr Params kClassic{"larson-classic", 5000, classic_size, true};
constexpr std::uint64_t kClassicGenerations = 3;  // two handoffs per lane

struct Lane {
  std::uint32_t index = 0;
  std::uint64_t generations = 0;
  std::size_t slot_count = 0;
  std::uint64_t replacements_per_generation = 0;
  std::uint64_t base = 0;
  std::vector<Block> slots;
  // threads[g] runs generation g; it is written by generation g-1 before that thread exits, so
  // joining threads[g-1] makes threads[g] visible to the joiner.
  std::vector<std::thread> threads;
};

Block new_slot_block(const Params& p, std::uint64_t base, Rng& rng, BlockId id) {
  if (!p.classic) return new_block(p.name, base, id, p.draw_size(rng));
  Block b;
  b.size = p.draw_size(rng);
  b.id = id;
  b.hash = pattern_hash(base, id);
  b.ptr = new char[b.size];  // throws rather than return NULL
  fill_pattern(b);
  return b;
}

void free_slot_block(const Params& p, const Block& b, const char* when) {
  verify_pattern(p.name, b, when);
  if (p.classic)
    delete[] static_cast<char*>(b.ptr);
  else
    std::free(b.ptr);
}

void run_generation(Context& ctx, const Params& p, Lane& lane, std::uint64_t generation) {
  Rng rng(ctx.options.seed, (std::uint64_t{lane.index} << 32) | generation);
  if (lane.slots.empty()) {
    lane.slots.resize(lane.slot_count);
    for (std::uint32_t s = 0; s < lane.slot_count; ++s)
      lane.slots[s] = new_slot_block(p, lane.base, rng, BlockId{lane.index, 0, s});
  }
  for (std::uint64_t k = 0; k < lane.replacements_per_generation; ++k) {
    const auto s = static_cast<std::uint32_t>(rng.below(lane.slot_count));
    free_slot_block(p, lane.slots[s], "before free by a later thread");
    lane.slots[s] = new_slot_block(p, lane.base, rng,
                                   BlockId{lane.index, 1 + generation * lane.replacements_per_generation + k, s});
  }
  ctx.progress.advance(1);
  if (generation + 1 < lane.generations) {
    lane.threads[generation + 1] = std::thread([&ctx, &p, &lane, generation] {
      run_generation(ctx, p, lane, generation + 1);
    });
    return;  // this thread exits; its blocks live on in the slice
  }
  for (Block& b : lane.slots) free_slot_block(p, b, "before free");
}

// larson-classic's warm-up on the calling thread: every lane's slice, allocated, shuffled among
// the lanes and churned. Block ids use task = lanes (no lane's index). Returns its operations.
std::uint64_t warm_up(Context& ctx, const Params& p, std::vector<Lane>& lanes) {
  const auto task = static_cast<std::uint32_t>(lanes.size());
  const std::uint64_t base = lanes[0].base;
  const std::size_t slice = lanes[0].slot_count;
  Rng rng(ctx.options.seed, std::uint64_t{0xC1A5} << 32);
  std::vector<Block> all(lanes.size() * slice);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = new_slot_block(p, base, rng, BlockId{task, 0, static_cast<std::uint32_t>(i)});
  for (std::size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  const std::uint64_t churn = 4 * all.size();
  for (std::uint64_t k = 0; k < churn; ++k) {
    const auto i = static_cast<std::uint32_t>(rng.below(all.size()));
    free_slot_block(p, all[i], "before free in the warm-up");
    all[i] = new_slot_block(p, base, rng, BlockId{task, 1 + k, i});
  }
  for (std::size_t l = 0; l < lanes.size(); ++l)
    lanes[l].slots.assign(all.begin() + l * slice, all.begin() + (l + 1) * slice);
  return all.size() + 2 * churn;
}

void run_lanes(Context& ctx, const Params& p, int lanes, std::uint64_t generations,
               std::size_t slot_count, std::uint64_t replacements_per_generation) {
  ctx.progress.begin(std::string(p.name) + " x" + std::to_string(lanes), generations * lanes);
  ctx.recorder.measure(p.name, lanes, [&] {
    std::vector<Lane> all(static_cast<std::size_t>(lanes));
    for (int i = 0; i < lanes; ++i) {
      all[i].index = static_cast<std::uint32_t>(i);
      all[i].generations = generations;
      all[i].slot_count = slot_count;
      all[i].replacements_per_generation = replacements_per_generation;
      all[i].base = workload_base(ctx.options.seed, p.name);
      all[i].threads.resize(generations);
    }
    const std::uint64_t warm_up_ops = p.classic ? warm_up(ctx, p, all) : 0;
    for (Lane& lane : all)
      lane.threads[0] = std::thread([&ctx, &p, &lane] { run_generation(ctx, p, lane, 0); });
    for (Lane& lane : all)
      for (std::thread& t : lane.threads) t.join();  // in order: see Lane::threads
    const std::uint64_t own_slices = p.classic ? 0 : slot_count;  // allocated by lanes
    return warm_up_ops + static_cast<std::uint64_t>(lanes) *
                             (own_slices + slot_count + 2 * generations * replacements_per_generation);
  },
  std::to_string(generations) + " generations of " + std::to_string(replacements_per_generation) +
      " per lane");
  ctx.progress.end();
}

}  // namespace

void run_larson(Context& ctx) {
  run_lanes(ctx, kLarson, ctx.threads(), ctx.scaled(100, 3, 3), kLarson.slots_per_lane, 5000);
}

void run_larson_classic(Context& ctx) {
  // --smoke: a tenth of the slots, so the warm-up stays small too.
  const std::size_t slots = ctx.tiny() ? kClassic.slots_per_lane / 10 : kClassic.slots_per_lane;
  const std::uint64_t replacements = ctx.scaled(100, 1) * slots;
  for (int lanes : row_thread_counts(ctx))
    run_lanes(ctx, kClassic, lanes, kClassicGenerations, slots, replacements);
}

}  // namespace brisk::stress
