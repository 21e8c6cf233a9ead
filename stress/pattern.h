// The fill pattern every workload writes into its blocks, and the check that reads it back.
//
// A block's pattern is a pure function of (seed, block id, offset): byte `off` is byte `off % 8`
// of the word `hash + (off / 8) * kWordStep`, where `hash` mixes the seed and the id. Neighbouring
// blocks, neighbouring words and neighbouring runs therefore differ, so a copy that drops a byte,
// a block handed out twice, or a write through a stale pointer shows up as a mismatch.
//
// Only a bounded part of a big block carries the pattern, its "sampled set" S(n):
//   - the first and the last kEdgeBytes bytes, and
//   - one 8-byte word at every multiple of stride(n) (64 KiB, or a larger power of two that
//     keeps it to kMaxInteriorWords words).
// Touching every byte of a 100 MiB block would measure page faults and memory bandwidth, not
// the allocator; the MMtest original never touches its blocks at all. The edges catch the
// classic damage (a realloc that copies short, a header written over the tail), and the
// interior words catch blocks that overlap.
//
// S(n) is chosen so that growing a block keeps the pattern valid: for old <= n,
// S(n) ∩ [0, old) ⊂ S(old) (the tail of n that falls below old lies in old's tail, and stride
// is a power of two that never shrinks as n grows), so after a growing realloc it is enough to
// fill S(n) ∩ [old, n).
#ifndef BRISK_STRESS_PATTERN_H
#define BRISK_STRESS_PATTERN_H

#include <cstddef>
#include <cstdint>

namespace brisk::stress {

inline constexpr std::size_t kEdgeBytes = 4096;
inline constexpr std::size_t kMinStride = 64 * 1024;
// Each interior word of a huge block costs a page fault, about 100 us on the 2-core VM brisk is
// developed on (a 20-iteration large run took 780 ms with 50 words per block, 70 ms with none).
inline constexpr std::size_t kMaxInteriorWords = 8;

// Identifies a block in a failure message: which task (thread or parallel-for index) made it,
// in which iteration, and which slot of that iteration.
struct BlockId {
  std::uint32_t task = 0;
  std::uint64_t iteration = 0;
  std::uint32_t slot = 0;
};

// A block under test: where it is, how many bytes are ours, and its pattern hash.
struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::uint64_t hash = 0;
  BlockId id;
};

// The per-workload base of every pattern hash: mixes --seed and the workload's name.
std::uint64_t workload_base(std::uint64_t seed, const char* workload);
// One block's pattern hash. One mix per block, so hashing stays cheap next to malloc.
std::uint64_t pattern_hash(std::uint64_t base, const BlockId& id);

// Fills S(size) ∩ [from, size) of the block.
void fill_pattern(const Block& block, std::size_t from = 0);
// Checks S(size) ∩ [0, limit) of the block (limit defaults to the whole block). On the first
// mismatch it reports and exits the process with status 1; `when` names the moment
// ("before free", "after realloc").
void verify_pattern(const char* workload, const Block& block, const char* when,
                    std::size_t limit = SIZE_MAX);
// Checks that S(size) of the block is all zero (a calloc result), reporting like verify_pattern.
void verify_zero(const char* workload, const Block& block, const char* when);

// Reports a verification failure that is not about a pattern byte (a wrong string, a NULL
// from the allocator) and exits with status 1.
[[noreturn]] void fail_verify(const char* workload, const BlockId& id, std::size_t offset,
                              const char* detail);

// Allocates `size` bytes with malloc for block `id` and fills its pattern (hash from `base`);
// a NULL from malloc fails the run.
Block new_block(const char* workload, std::uint64_t base, const BlockId& id, std::size_t size);
// Checks the block's pattern and frees it with free.
void free_block(const char* workload, const Block& block, const char* when);

// Realloc with verification: checks the old pattern, reallocates, checks that the surviving
// prefix moved intact and extends the pattern over the new part. Returns the updated block.
Block verified_realloc(const char* workload, Block block, std::size_t new_size);

}  // namespace brisk::stress

#endif  // BRISK_STRESS_PATTERN_H
