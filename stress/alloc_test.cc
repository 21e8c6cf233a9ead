// Random-slot churn of small blocks after alloc-test (Ivan Nikolaev, OLogN Technologies, as
// mimalloc-bench runs it: 2^18 slots shared out among the threads, sizes up to 1 KiB, every
// block written in full when allocated and read in full before it is freed), written afresh.
//
// Each thread owns an array of slots; about half of them start with a block. Then each step
// picks a slot, four times in five among the hottest fifth of the slots: a full slot has its
// block read (checked against its pattern) and freed, an empty one gets a new block, written in
// full. Sizes are 8..1023 B: the octave 8..15 is drawn with probability 1/2, 16..31 with 1/4,
// and so on to 512..1023 (1/64, like 256..511), then a size within it. The program's own pass
// over its blocks is part of the row, as in the original: where an allocator places blocks
// (cache lines, pages) shows up in that pass as well as in malloc and free.
//
// Runs on one thread, then on --threads threads.
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>
#include <vector>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "alloc-test";
constexpr std::size_t kTotalSlots = std::size_t{1} << 18;
constexpr unsigned kLastOctave = 6;  // 512..1023 B

std::size_t draw_size(Rng& rng) {
  const std::uint64_t r = rng.next();
  // Trailing zeros of a random word: k with probability 2^-(k+1); capped at kLastOctave.
  const auto octave = static_cast<unsigned>(std::countr_zero(r | (std::uint64_t{1} << kLastOctave)));
  const std::size_t low = std::size_t{8} << octave;
  return low + static_cast<std::size_t>((r >> 8) % low);
}

std::size_t pick_slot(Rng& rng, std::size_t slots) {
  const std::size_t hot = std::max<std::size_t>(slots / 5, 1);
  return rng.below(5) != 0 ? rng.below(hot) : rng.below(slots);
}

// One thread's run: returns its operation count.
std::uint64_t churn_slots(Context& ctx, std::uint64_t base, std::uint32_t task, std::size_t slot_count,
                          std::uint64_t steps) {
  Rng rng(ctx.options.seed, std::uint64_t{0xA7E5} << 32 | task);
  std::vector<Block> slots(slot_count);
  std::uint64_t ops = 0;
  auto fill = [&](std::size_t s, std::uint64_t step) {
    slots[s] = new_block(kName, base, BlockId{task, step, static_cast<std::uint32_t>(s)}, draw_size(rng));
    ++ops;
  };
  auto release = [&](std::size_t s) {
    free_block(kName, slots[s], "before free");
    slots[s].ptr = nullptr;
    ++ops;
  };
  for (std::size_t s = 0; s < slot_count; ++s)
    if (rng.below(2) == 0) fill(s, 0);
  for (std::uint64_t step = 1; step <= steps; ++step) {
    const std::size_t s = pick_slot(rng, slot_count);
    if (slots[s].ptr != nullptr)
      release(s);
    else
      fill(s, step);
    if (step % 4096 == 0) ctx.progress.advance(4096);
  }
  for (std::size_t s = 0; s < slot_count; ++s)
    if (slots[s].ptr != nullptr) release(s);
  return ops;
}

}  // namespace

void run_alloc_test(Context& ctx) {
  const std::uint64_t steps = ctx.scaled(4'000'000, 20'000);
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  // --smoke: a sixteenth of the slots, so filling and emptying them stays small too.
  const std::size_t total_slots = ctx.tiny() ? kTotalSlots / 16 : kTotalSlots;
  const std::string note =
      std::to_string(total_slots) + " slots shared out, " + std::to_string(steps) + " steps per thread";
  measure_rows(ctx, kName, steps, note, [&](int threads) {
    const std::size_t slots = total_slots / static_cast<std::size_t>(threads);
    return run_on_threads(threads, [&](std::uint32_t task) { return churn_slots(ctx, base, task, slots, steps); });
  });
}

}  // namespace brisk::stress
