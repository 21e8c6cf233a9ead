// Threads that trade blocks and exit, after mimalloc-bench's mstress (Daan Leijen's stress test,
// as mimalloc-bench runs it: `mstress N 50 25`, load 50 and 25 rounds), written afresh.
//
// Each round starts the threads afresh; thread t takes 100 * load * (t % 8 + 1) working
// allocations and half as many retained ones (some threads do more than others); the load is
// 50 at --scale 100 (--scale scales it, as mstress's own scale argument does). Each step
//   - allocates: a working block of 8 to 128 B (a power of two) when a coin says so or no
//     retained ones are left, else a retained block of 8 to 512 B kept to the thread's end;
//     one block in 100 is 100 times bigger, one in 1,000 a thousand, one in 10,000 ten thousand
//     times (up to 5 MiB);
//   - with probability 2/3 frees a random working block (if that slot still holds one);
//   - with probability 1/4 swaps a random working slot with a random entry of an array of
//     1,000 blocks shared by all threads.
// A thread frees its retained and working blocks and exits; the blocks it put into the shared
// array outlive it, and after each round the main thread frees about half of them (all after the
// last round). So blocks are freed by threads that did not allocate them, often after their
// allocating thread has exited. Every block is filled when allocated and checked when freed.
//
// Runs on one thread, then on --threads threads (in each round).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "mstress";
constexpr std::size_t kTransfers = 1000;
constexpr std::uint32_t kRounds = 25;

// The shared array. The original swaps bare pointers with an atomic exchange; here an entry is
// a whole Block (pointer, size, pattern hash), so each entry has a lock of its own. With 1,000
// entries two threads rarely meet on one.
class TransferArray {
 public:
  TransferArray() : entries_(new Entry[kTransfers]) {}

  // Puts `block` into entry i and returns what was there (ptr == nullptr: nothing).
  Block exchange(std::size_t i, const Block& block) {
    Entry& e = entries_[i];
    while (e.busy.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    const Block old = e.block;
    e.block = block;
    e.busy.clear(std::memory_order_release);
    return old;
  }

 private:
  struct Entry {
    std::atomic_flag busy;  // clear when constructed (C++20)
    Block block;
  };
  std::unique_ptr<Entry[]> entries_;
};

std::size_t size_factor(Rng& rng) {
  if (rng.below(100) != 0) return 1;
  if (rng.below(100) == 0) return 10000;
  return rng.below(10) == 0 ? 1000 : 100;
}

struct Run {
  Context& ctx;
  std::uint64_t base;
  std::uint64_t load;
  TransferArray transfers;
};

// One thread of one round: returns its operation count. Block ids: task = round << 16 | thread,
// slot 0 for working blocks and 1 for retained ones.
std::uint64_t trade(Run& run, std::uint32_t round, std::uint32_t thread) {
  const std::uint32_t task = round << 16 | thread;
  Rng rng(run.ctx.options.seed, std::uint64_t{0x357E55} << 40 | task);
  std::uint64_t working_left = 100 * run.load * (thread % 8 + 1);
  std::uint64_t retained_left = working_left / 2;
  std::vector<Block> working;
  std::vector<Block> retained;
  working.reserve(working_left);
  retained.reserve(retained_left);
  std::uint64_t ops = 0;
  auto make = [&](std::size_t max_shift, std::uint64_t step, std::uint32_t kind) {
    const std::size_t words = (std::size_t{1} << rng.below(max_shift)) * size_factor(rng);
    ++ops;
    return new_block(kName, run.base, BlockId{task, step, kind}, words * sizeof(std::uint64_t));
  };
  auto release = [&](Block& b) {
    if (b.ptr == nullptr) return;
    free_block(kName, b, "before free");
    b.ptr = nullptr;
    ++ops;
  };
  for (std::uint64_t step = 0; working_left > 0 || retained_left > 0; ++step) {
    if (step % 1024 == 1023) run.ctx.progress.advance(1024);
    if (retained_left == 0 || (working_left > 0 && rng.below(2) == 0)) {
      --working_left;
      working.push_back(make(5, step, 0));
    } else {
      --retained_left;
      retained.push_back(make(7, step, 1));
    }
    if (working.empty()) continue;
    if (rng.below(3) != 0) release(working[rng.below(working.size())]);
    if (rng.below(4) == 0) {
      Block& b = working[rng.below(working.size())];
      b = run.transfers.exchange(rng.below(kTransfers), b);
    }
  }
  for (Block& b : retained) release(b);
  for (Block& b : working) release(b);
  return ops;
}

void run_on(Context& ctx, int threads, std::uint64_t load, std::uint32_t rounds) {
  std::uint64_t steps_per_round = 0;
  for (int t = 0; t < threads; ++t) steps_per_round += 150 * load * (t % 8 + 1);
  ctx.progress.begin(std::string(kName) + " x" + std::to_string(threads), steps_per_round * rounds);
  ctx.recorder.measure(kName, threads, [&] {
    Run run{ctx, workload_base(ctx.options.seed, kName), load, {}};
    Rng rng(ctx.options.seed, 0x357E55);
    std::uint64_t ops = 0;
    for (std::uint32_t round = 0; round < rounds; ++round) {
      ops += run_on_threads(threads, [&](std::uint32_t thread) { return trade(run, round, thread); });
      const bool last = round + 1 == rounds;
      for (std::size_t i = 0; i < kTransfers; ++i) {
        if (!last && rng.below(2) == 0) continue;
        const Block b = run.transfers.exchange(i, Block{});
        if (b.ptr == nullptr) continue;
        free_block(kName, b, "before free by the main thread");
        ++ops;
      }
    }
    return ops;
  },
  std::to_string(rounds) + " rounds at load " + std::to_string(load));
  ctx.progress.end();
}

}  // namespace

void run_mstress(Context& ctx) {
  const std::uint64_t load = ctx.scaled(50, 2);
  const std::uint32_t rounds = ctx.tiny() ? 3 : kRounds;
  for (int threads : row_thread_counts(ctx)) run_on(ctx, threads, load, rounds);
}

}  // namespace brisk::stress
