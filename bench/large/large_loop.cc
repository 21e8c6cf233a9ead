// A replacement loop of big zero-initialised buffers, the shape of mimalloc-bench's malloc-large
// (written afresh): `--buffers` slots each hold a buffer of a random size between `--min-mib` and
// `--max-mib`; each of `--steps` steps replaces a random slot's buffer with a new one, allocated
// with new char[n]() so that the program writes every page of it, as std::make_unique<char[]>
// does. Each new buffer is checked to read zero at its first and last byte and at one byte per
// 64 KiB before it is replaced. It calls no allocator API, so it runs under any allocator,
// preloaded:
//
//   LD_PRELOAD=libbrisk.so brisk-large-loop [--buffers 20] [--min-mib 5] [--max-mib 25] [--steps 2000]
//
// Exit status: 0, 1 if a buffer did not read zero, 2 on wrong usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cli.h"

namespace {

constexpr const char* kTool = "brisk-large-loop";
constexpr const char* kSynopsis = "[--buffers N] [--min-mib N] [--max-mib N] [--steps N]";

constexpr unsigned long kMaxCount = 1000000;

}  // namespace

int main(int argc, char** argv) {
  unsigned long buffers = 20, min_mib = 5, max_mib = 25, steps = 2000;
  brisk::bench::parse_counts(argc, argv, kTool, kSynopsis,
                             {{"--buffers", &buffers, kMaxCount},
                              {"--min-mib", &min_mib, kMaxCount},
                              {"--max-mib", &max_mib, kMaxCount},
                              {"--steps", &steps, kMaxCount}});
  if (min_mib > max_mib || max_mib > 4096)
    brisk::bench::usage(kTool, kSynopsis, "--min-mib must not exceed --max-mib, at most 4096");
  std::vector<std::unique_ptr<char[]>> slot(buffers);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> size_of(min_mib << 20, max_mib << 20);
  std::uniform_int_distribution<std::size_t> slot_of(0, buffers - 1);
  for (unsigned long step = 0; step < steps; ++step) {
    const std::size_t n = size_of(rng);
    std::unique_ptr<char[]> fresh(new char[n]());
    for (std::size_t at = 0; at < n; at += 64 << 10) {
      if (fresh[at] != 0) {
        std::fprintf(stderr, "brisk-large-loop: step %lu: byte %zu of a new %zu-byte buffer is not zero\n", step, at, n);
        return 1;
      }
    }
    if (fresh[n - 1] != 0) {
      std::fprintf(stderr, "brisk-large-loop: step %lu: the last byte of a new %zu-byte buffer is not zero\n", step, n);
      return 1;
    }
    slot[slot_of(rng)] = std::move(fresh);
  }
  std::printf("buffers=%lu min_mib=%lu max_mib=%lu steps=%lu\n", buffers, min_mib, max_mib, steps);
  return 0;
}
