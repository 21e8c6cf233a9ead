// Thread churn: rounds of short-lived threads. In each round every thread frees (after checking)
// the blocks the previous round handed it, allocates a fresh batch, frees half of it itself and
// hands the other half to a thread of the next round, then exits. The blocks a thread leaves
// behind are freed by a thread that did not exist when they were allocated.
//
// The round's peak RSS is recorded. If the last rounds' RSS has grown past twice the RSS after
// the first rounds, memory freed after its owner thread exited is not coming back, and the
// workload fails: the same work per round must not need more and more memory.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "churn";
constexpr std::size_t kBlocksPerThread = 1000;
constexpr std::uint64_t kMinRounds = 8;
// Allowance on top of 2x for processes whose baseline RSS is tiny (smoke runs): a few MiB of
// allocator metadata or thread stacks cached by libc is not unbounded growth.
constexpr std::uint64_t kSlackKib = 16 * 1024;

std::size_t churn_size(Rng& rng) {
  return rng.below(16) == 0 ? rng.between(4097, 64 * 1024) : rng.between(8, 4096);
}

void churn_thread(std::uint64_t base, std::uint64_t seed, std::uint64_t round,
                  std::uint32_t index, std::vector<Block>& inbox, std::vector<Block>& outbox) {
  for (Block& b : inbox) {
    verify_pattern(kName, b, "before free by a thread of the next round");
    std::free(b.ptr);
  }
  inbox.clear();
  Rng rng(seed, (round << 32) | index);
  std::vector<Block> mine;
  mine.reserve(kBlocksPerThread);
  for (std::uint32_t s = 0; s < kBlocksPerThread; ++s) {
    Block b;
    b.size = churn_size(rng);
    b.id = BlockId{index, round, s};
    b.hash = pattern_hash(base, b.id);
    b.ptr = std::malloc(b.size);
    if (b.ptr == nullptr) fail_verify(kName, b.id, 0, "malloc returned NULL");
    fill_pattern(b);
    mine.push_back(b);
  }
  for (std::uint32_t s = 0; s < kBlocksPerThread; ++s) {
    if (s % 2 == 0) {
      verify_pattern(kName, mine[s], "before free");
      std::free(mine[s].ptr);
    } else {
      outbox.push_back(mine[s]);
    }
  }
}

}  // namespace

void run_churn(Context& ctx) {
  const int threads = ctx.threads();
  const std::uint64_t rounds = ctx.scaled(400, kMinRounds, kMinRounds);
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  std::vector<std::uint64_t> rss_per_round;
  rss_per_round.reserve(rounds);

  ctx.progress.begin("churn x" + std::to_string(threads), rounds);
  ctx.recorder.measure(kName, threads, [&] {
    // handoff[t]: the blocks round r's thread t leaves to round r+1's thread (t+1) % threads.
    std::vector<std::vector<Block>> handoff(threads), next(threads);
    for (std::uint64_t r = 0; r < rounds; ++r) {
      reset_peak_rss();
      std::vector<std::thread> pool;
      pool.reserve(threads);
      for (int t = 0; t < threads; ++t) {
        const int receiver = (t + 1) % threads;
        pool.emplace_back([&, t, receiver, r] {
          churn_thread(base, ctx.options.seed, r, static_cast<std::uint32_t>(t), handoff[t],
                       next[receiver]);
        });
      }
      for (std::thread& th : pool) th.join();
      std::swap(handoff, next);
      rss_per_round.push_back(peak_rss_kib());
      ctx.progress.advance(1);
    }
    for (auto& box : handoff)
      for (Block& b : box) {
        verify_pattern(kName, b, "before free");
        std::free(b.ptr);
      }
    return rounds * threads * (2 * kBlocksPerThread);
  });
  ctx.progress.end();

  // First and last quarter of the rounds (at least two each). The very first round is left out
  // of the baseline: it pays for thread stacks and caches that later rounds reuse.
  const std::size_t quarter = std::max<std::size_t>(2, rss_per_round.size() / 4);
  const std::uint64_t first = *std::max_element(rss_per_round.begin() + 1, rss_per_round.begin() + 1 + quarter);
  const std::uint64_t last = *std::max_element(rss_per_round.end() - quarter, rss_per_round.end());
  Row& row = ctx.recorder.last_row(kName, threads);
  row.series_kib = rss_per_round;
  char note[160];
  std::snprintf(note, sizeof note, "%" PRIu64 " rounds; RSS first rounds %" PRIu64
                " KiB, last rounds %" PRIu64 " KiB", rounds, first, last);
  row.note = note;
  if (last > 2 * first + kSlackKib) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "VERIFY FAILED: workload=churn block=none offset=0 RSS grew across rounds: "
                 "%" PRIu64 " KiB after the first rounds, %" PRIu64 " KiB in the last rounds\n",
                 first, last);
    std::fflush(stderr);
    _exit(1);
  }
}

}  // namespace brisk::stress
