#include "bench/micro/fill_check_bench.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/compare/stats.h"
#include "debug/fill_check.h"

namespace brisk::bench {
namespace {

constexpr std::uint8_t kPattern = 0xA5;
constexpr std::size_t kSizes[] = {15, 39, 40, 41, 64, 4096, 65536};

// Every loop answers the same question, "is the block intact?", and is a real call (noinline),
// as the check is from the allocator's free path.
using CheckFn = bool (*)(const std::uint8_t* p, std::size_t n);

std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The 4/2/1-byte remainder both baseline loops end with.
inline bool remainder_intact(const std::uint8_t* p, std::size_t n) {
  if (n >= 4) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    if (v != 0x01010101u * kPattern) return false;
    p += 4, n -= 4;
  }
  if (n >= 2) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    if (v != static_cast<std::uint16_t>(0x0101u * kPattern)) return false;
    p += 2, n -= 2;
  }
  return n == 0 || *p == kPattern;
}

__attribute__((noinline)) bool loop8(const std::uint8_t* p, std::size_t n) {
  const std::uint64_t w = 0x0101010101010101ull * kPattern;
  for (; n >= 8; p += 8, n -= 8)
    if (load64(p) != w) return false;
  return remainder_intact(p, n);
}

// The seed's change: four words per iteration before the 8-byte loop, with the four compares
// folded into one branch as its maintainer did.
__attribute__((noinline)) bool loop32(const std::uint8_t* p, std::size_t n) {
  const std::uint64_t w = 0x0101010101010101ull * kPattern;
  for (; n >= 32; p += 32, n -= 32)
    if (((load64(p) ^ w) | (load64(p + 8) ^ w) | (load64(p + 16) ^ w) | (load64(p + 24) ^ w)) != 0) return false;
  for (; n >= 8; p += 8, n -= 8)
    if (load64(p) != w) return false;
  return remainder_intact(p, n);
}

const std::uint8_t* g_pattern_buffer = nullptr;  // kSizes' largest, all kPattern

__attribute__((noinline)) bool with_memcmp(const std::uint8_t* p, std::size_t n) {
  return std::memcmp(p, g_pattern_buffer, n) == 0;
}

__attribute__((noinline)) bool dispatched(const std::uint8_t* p, std::size_t n) {
  return debug::find_fill_damage(p, n, kPattern) == n;
}

template <debug::FillCheckImpl impl>
__attribute__((noinline)) bool direct(const std::uint8_t* p, std::size_t n) {
  return debug::find_fill_damage_with(impl, p, n, kPattern) == n;
}

struct Loop {
  const char* name;
  CheckFn fn;
};

std::vector<Loop> loops() {
  std::vector<Loop> all = {{"check", dispatched}, {"loop8", loop8}, {"loop32", loop32}, {"memcmp", with_memcmp}};
  using debug::FillCheckImpl;
  const std::pair<FillCheckImpl, CheckFn> impls[] = {{FillCheckImpl::kPortable, direct<FillCheckImpl::kPortable>},
                                                     {FillCheckImpl::kSse2, direct<FillCheckImpl::kSse2>},
                                                     {FillCheckImpl::kAvx2, direct<FillCheckImpl::kAvx2>},
                                                     {FillCheckImpl::kAvx512, direct<FillCheckImpl::kAvx512>}};
  for (const auto& [impl, fn] : impls)
    if (debug::fill_check_supported(impl)) all.push_back({debug::fill_check_name(impl), fn});
  return all;
}

// One freed block of each size, 16-byte aligned like the allocator's blocks, filled once.
struct Blocks {
  std::uint8_t* memory;
  Blocks() {
    memory = static_cast<std::uint8_t*>(std::aligned_alloc(64, 65536 + 64));
    std::memset(memory, kPattern, 65536 + 64);
    auto* pattern = static_cast<std::uint8_t*>(std::aligned_alloc(64, 65536));
    std::memset(pattern, kPattern, 65536);
    g_pattern_buffer = pattern;
  }
  const std::uint8_t* block() const { return memory + 16; }
};

const Blocks& blocks() {
  static Blocks b;
  return b;
}

void run_case(benchmark::State& state, CheckFn fn) {
  const std::size_t size = static_cast<std::size_t>(state.range(0));
  const std::uint8_t* p = blocks().block();
  for (auto _ : state) {
    benchmark::DoNotOptimize(p);
    bool intact = fn(p, size);
    benchmark::DoNotOptimize(intact);
  }
  if (!fn(p, size)) state.SkipWithError("the loop calls an intact block damaged");
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(size));
}

// Nanoseconds per check over a batch long enough (about 0.2 ms) that the clock's cost is noise.
double time_batch(CheckFn fn, std::size_t size, long iterations) {
  const std::uint8_t* p = blocks().block();
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    benchmark::DoNotOptimize(p);
    bool intact = fn(p, size);
    benchmark::DoNotOptimize(intact);
  }
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(iterations);
}

std::string format_size(std::size_t size) {
  return size >= 1024 ? std::to_string(size / 1024) + " KiB" : std::to_string(size) + " B";
}

}  // namespace

void register_fill_check_cases() {
  for (const Loop& loop : loops()) {
    auto* b = benchmark::RegisterBenchmark((std::string("fill_check/") + loop.name).c_str(), run_case, loop.fn);
    for (std::size_t size : kSizes) b->Arg(static_cast<std::int64_t>(size));
  }
}

int run_fill_check_pairs(int pairs, std::FILE* out) {
  const std::vector<Loop> all = loops();
  constexpr int kWarmups = 3;
  std::fprintf(out, "Fill-pattern check, %s dispatched; %d paired rounds after %d warm-ups per size.\n",
               debug::fill_check_name(debug::fill_check_selected()), pairs, kWarmups);
  std::fprintf(out, "Each cell: median of (loop time / check time) over the rounds [95%% bootstrap interval];\n"
                    "above 1: the dispatched check is faster.\n\n");
  std::fprintf(out, "| size | check ns |");
  for (std::size_t l = 1; l < all.size(); ++l) std::fprintf(out, " %s / check |", all[l].name);
  std::fprintf(out, "\n|---:|---:|");
  for (std::size_t l = 1; l < all.size(); ++l) std::fprintf(out, "---|");
  std::fprintf(out, "\n");
  for (std::size_t size : kSizes) {
    for (const Loop& loop : all)
      if (!loop.fn(blocks().block(), size)) {
        std::fprintf(stderr, "brisk-microbench: %s calls an intact %zu-byte block damaged\n", loop.name, size);
        return 1;
      }
    const long iterations = static_cast<long>(std::max<std::size_t>(200, (1u << 22) / (size + 64)));
    std::vector<std::vector<double>> times(all.size());
    for (int round = 0; round < kWarmups + pairs; ++round) {
      for (std::size_t k = 0; k < all.size(); ++k) {
        const std::size_t l = (k + static_cast<std::size_t>(round)) % all.size();
        const double ns = time_batch(all[l].fn, size, iterations);
        if (round >= kWarmups) times[l].push_back(ns);
      }
    }
    std::fprintf(out, "| %s | %.2f |", format_size(size).c_str(), median(times[0]));
    for (std::size_t l = 1; l < all.size(); ++l) {
      const PairedSummary s = summarize_pairs(times[l], times[0]);
      std::fprintf(out, " %.2f [%.2f, %.2f] |", s.median_ratio, s.ratio_interval.low, s.ratio_interval.high);
    }
    std::fprintf(out, "\n");
  }
  return 0;
}

}  // namespace brisk::bench
