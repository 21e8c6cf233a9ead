// Deterministic random numbers for the workloads: every thread seeds its own generator from
// --seed and its task index, so a run's sizes and patterns depend only on the seed.
#ifndef BRISK_STRESS_RNG_H
#define BRISK_STRESS_RNG_H

#include <cstddef>
#include <cstdint>

namespace brisk::stress {

// The splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// splitmix64: one add and one mix per number, small state, enough quality for picking sizes.
class Rng {
 public:
  Rng(std::uint64_t seed, std::uint64_t stream) : state_(mix64(seed ^ mix64(stream + 1))) {}

  std::uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, n) (n > 0); the modulo bias is irrelevant here.
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  // Uniform in [lo, hi].
  std::size_t between(std::size_t lo, std::size_t hi) { return lo + below(hi - lo + 1); }

 private:
  std::uint64_t state_;
};

}  // namespace brisk::stress

#endif  // BRISK_STRESS_RNG_H
