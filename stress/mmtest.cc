// The seed's MMtest (../shared/seeds/first-fastmm5-performance-tests.txt), ported faithfully.
//
// The Delphi original runs four tests, each once on the calling thread and once as
// TParallel.For(1, 10, ...), where every one of the 10 iterations runs the whole test again:
//   MemoryTest(1)    100,000 x { GetMemory(j*10) for j=1..10; ReallocMemory to j*20; FreeMemory }
//   MemoryTest(1024) the same with j*10 KiB reallocated to j*20 KiB
//   MemoryTest2      10,000 x { GetMemory(j*10 MiB) for j=1..10; FreeMemory }
//   StringTest       build a 101-char string, append it 1,000 times, then 1,000 times
//                    Result := sTemp + Result + sTemp
// Here GetMemory/ReallocMemory/FreeMemory are malloc/realloc/free and the parallel for is a
// 10-way tbb::parallel_for in a task_arena of --threads threads. Unlike the original, every
// block carries a verified pattern (pattern.h); that work is the same for every allocator.
// --pool threads runs the 10 iterations on 10 new std::threads instead (run_both).
// The *-raw workloads run the tests as written, touching no block (below).
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr int kParallelIterations = 10;  // TParallel.For(1, 10, ...)
constexpr int kBlocksPerIteration = 10;  // p: Array[1..10] of Pointer
constexpr std::uint64_t kProgressBatch = 16;

// MemoryTest(iCoeff): returns its allocation operation count.
std::uint64_t memory_test(Context& ctx, const char* name, std::uint32_t task, std::size_t coeff,
                          std::uint64_t iterations) {
  const std::uint64_t base = workload_base(ctx.options.seed, name);
  Block p[kBlocksPerIteration + 1];
  for (std::uint64_t i = 0; i < iterations; ++i) {
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) {
      Block& b = p[j];
      b.size = j * 10 * coeff;
      b.id = BlockId{task, i, j};
      b.hash = pattern_hash(base, b.id);
      b.ptr = std::malloc(b.size);
      if (b.ptr == nullptr) fail_verify(name, b.id, 0, "malloc returned NULL");
      fill_pattern(b);
    }
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j)
      p[j] = verified_realloc(name, p[j], j * 20 * coeff);
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) {
      verify_pattern(name, p[j], "before free");
      std::free(p[j].ptr);
    }
    if ((i + 1) % kProgressBatch == 0) ctx.progress.advance(kProgressBatch);
  }
  ctx.progress.advance(iterations % kProgressBatch);
  return iterations * 3 * kBlocksPerIteration;
}

// MemoryTest2. The pattern covers a bounded part of each 10..100 MiB block (pattern.h): filling
// it all would time page faults and memory bandwidth, which the original never touches.
std::uint64_t memory_test2(Context& ctx, const char* name, std::uint32_t task,
                           std::uint64_t iterations) {
  const std::uint64_t base = workload_base(ctx.options.seed, name);
  constexpr std::size_t kMiB10 = 10485760;
  Block p[kBlocksPerIteration + 1];
  for (std::uint64_t i = 0; i < iterations; ++i) {
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) {
      Block& b = p[j];
      b.size = j * kMiB10;
      b.id = BlockId{task, i, j};
      b.hash = pattern_hash(base, b.id);
      b.ptr = std::malloc(b.size);
      if (b.ptr == nullptr) fail_verify(name, b.id, 0, "malloc returned NULL");
      fill_pattern(b);
    }
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) {
      verify_pattern(name, p[j], "before free");
      std::free(p[j].ptr);
    }
    ctx.progress.advance(1);
  }
  return iterations * 2 * kBlocksPerIteration;
}

// StringTest. Delphi compiles `Result := Result + sTemp` to an in-place append that reallocates
// Result, and `sTemp + Result + sTemp` to one allocation of the summed length; the std::string
// code below makes the same single allocation per concatenation (reserve, then append) and
// frees the previous string, so each concatenation is one new and one delete.
std::uint64_t string_test(Context& ctx, const char* name, std::uint32_t task,
                          std::uint64_t repeats) {
  std::string temp;
  temp.reserve(101);
  for (int c = 32; c <= 132; ++c) temp.push_back(static_cast<char>(c));
  std::string result;
  for (std::uint64_t i = 0; i < repeats; ++i) {
    std::string next;
    next.reserve(result.size() + temp.size());
    next.append(result).append(temp);
    result = std::move(next);
  }
  for (std::uint64_t i = 0; i < repeats; ++i) {
    std::string next;
    next.reserve(result.size() + 2 * temp.size());
    next.append(temp).append(result).append(temp);
    result = std::move(next);
  }
  // The result is temp repeated 3 * repeats times: check every byte of it.
  const std::size_t expected_size = 3 * repeats * temp.size();
  if (result.size() != expected_size) {
    char detail[120];
    std::snprintf(detail, sizeof detail, "string length %zu, expected %zu", result.size(),
                  expected_size);
    fail_verify(name, BlockId{task, 0, 0}, 0, detail);
  }
  for (std::size_t i = 0; i < result.size(); ++i) {
    const char want = static_cast<char>(32 + i % 101);
    if (result[i] != want) {
      char detail[120];
      std::snprintf(detail, sizeof detail, "size=%zu expected=0x%02x found=0x%02x (final string)",
                    result.size(), static_cast<unsigned char>(want),
                    static_cast<unsigned char>(result[i]));
      fail_verify(name, BlockId{task, 0, 0}, i, detail);
    }
  }
  ctx.progress.advance(1);
  // One new and one delete per concatenation, plus temp's and the final string's.
  return 2 * (2 * repeats + 1);
}

// ---- MMtest as written ---------------------------------------------------------------------
// The same four tests with nothing but what the original does: its blocks are never written
// or read, so the large test in particular measures mapping and unmapping, not page faults.
// The only addition is an empty asm that takes each pointer, so the compiler cannot drop a
// malloc/free pair it sees through.

inline void keep(void* p) { asm volatile("" : : "g"(p) : "memory"); }

void* checked(const char* name, void* p, std::uint32_t task, std::uint64_t i, std::uint32_t j) {
  if (p == nullptr) fail_verify(name, BlockId{task, i, j}, 0, "allocation returned NULL");
  keep(p);
  return p;
}

std::uint64_t memory_test_as_written(Context& ctx, const char* name, std::uint32_t task,
                                     std::size_t coeff, std::uint64_t iterations) {
  void* p[kBlocksPerIteration + 1];
  for (std::uint64_t i = 0; i < iterations; ++i) {
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j)
      p[j] = checked(name, std::malloc(j * 10 * coeff), task, i, j);
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j)
      p[j] = checked(name, std::realloc(p[j], j * 20 * coeff), task, i, j);
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) std::free(p[j]);
    if ((i + 1) % kProgressBatch == 0) ctx.progress.advance(kProgressBatch);
  }
  ctx.progress.advance(iterations % kProgressBatch);
  return iterations * 3 * kBlocksPerIteration;
}

std::uint64_t memory_test2_as_written(Context& ctx, const char* name, std::uint32_t task,
                                      std::uint64_t iterations) {
  constexpr std::size_t kMiB10 = 10485760;
  void* p[kBlocksPerIteration + 1];
  for (std::uint64_t i = 0; i < iterations; ++i) {
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j)
      p[j] = checked(name, std::malloc(j * kMiB10), task, i, j);
    for (std::uint32_t j = 1; j <= kBlocksPerIteration; ++j) std::free(p[j]);
    ctx.progress.advance(1);
  }
  return iterations * 2 * kBlocksPerIteration;
}

// The string test as the original writes it, `Result := Result + sTemp` as an append and
// `sTemp + Result + sTemp` as two concatenations, without the final check of every byte.
std::uint64_t string_test_as_written(Context& ctx, std::uint64_t repeats) {
  std::string temp;
  for (int c = 32; c <= 132; ++c) temp = temp + static_cast<char>(c);
  std::string result;
  for (std::uint64_t i = 0; i < repeats; ++i) result = result + temp;
  for (std::uint64_t i = 0; i < repeats; ++i) result = temp + result + temp;
  keep(result.data());
  ctx.progress.advance(1);
  // About one new and one delete per concatenation (std::string's growth decides the rest).
  return 2 * (101 + 3 * repeats);
}

// Runs one MMtest test on one thread, then as the 10-way parallel for (either half alone with
// --rows).
void run_both(Context& ctx, const char* name, std::uint64_t units_per_run,
              const std::function<std::uint64_t(std::uint32_t task)>& test) {
  if (ctx.options.single_row) {
    ctx.progress.begin(std::string(name) + " x1", units_per_run);
    ctx.recorder.measure(name, 1, [&] { return test(0); });
    ctx.progress.end();
  }
  if (!ctx.options.parallel_row) return;

  if (ctx.options.plain_threads) {
    // As the article's runs on plain threads: each iteration on a thread of its own, all 10 at
    // once, each thread's heap empty at its start and detached at its exit.
    ctx.progress.begin(std::string(name) + " x" + std::to_string(kParallelIterations) + " threads",
                       units_per_run * kParallelIterations);
    ctx.recorder.measure(name, kParallelIterations, [&] {
      return run_on_threads(kParallelIterations, [&](std::uint32_t t) { return test(t + 1); });
    });
    ctx.progress.end();
    return;
  }
  const int threads = ctx.threads();
  tbb::task_arena arena(threads);
  ctx.progress.begin(std::string(name) + " x" + std::to_string(threads),
                     units_per_run * kParallelIterations);
  ctx.recorder.measure(name, threads, [&] {
    std::atomic<std::uint64_t> ops{0};
    arena.execute([&] {
      // simple_partitioner with grain 1: every iteration is its own task, as in TParallel.For.
      tbb::parallel_for(
          tbb::blocked_range<int>(1, kParallelIterations + 1, 1),
          [&](const tbb::blocked_range<int>& r) {
            for (int i = r.begin(); i != r.end(); ++i)
              ops.fetch_add(test(static_cast<std::uint32_t>(i)), std::memory_order_relaxed);
          },
          tbb::simple_partitioner());
    });
    return ops.load();
  });
  ctx.progress.end();
}

}  // namespace

void run_small(Context& ctx) {
  const std::uint64_t n = ctx.scaled(100000, 2000);
  run_both(ctx, "small", n, [&](std::uint32_t task) { return memory_test(ctx, "small", task, 1, n); });
}

void run_medium(Context& ctx) {
  const std::uint64_t n = ctx.scaled(100000, 20);
  run_both(ctx, "medium", n,
           [&](std::uint32_t task) { return memory_test(ctx, "medium", task, 1024, n); });
}

void run_large(Context& ctx) {
  const std::uint64_t n = ctx.scaled(10000, 4);
  run_both(ctx, "large", n, [&](std::uint32_t task) { return memory_test2(ctx, "large", task, n); });
}

void run_strings(Context& ctx) {
  const std::uint64_t repeats = ctx.scaled(1000, 300);
  run_both(ctx, "strings", 1,
           [&](std::uint32_t task) { return string_test(ctx, "strings", task, repeats); });
}

void run_small_as_written(Context& ctx) {
  const std::uint64_t n = ctx.scaled(100000, 2000);
  run_both(ctx, "small-raw", n,
           [&](std::uint32_t task) { return memory_test_as_written(ctx, "small-raw", task, 1, n); });
}

void run_medium_as_written(Context& ctx) {
  const std::uint64_t n = ctx.scaled(100000, 20);
  run_both(ctx, "medium-raw", n,
           [&](std::uint32_t task) { return memory_test_as_written(ctx, "medium-raw", task, 1024, n); });
}

void run_large_as_written(Context& ctx) {
  const std::uint64_t n = ctx.scaled(10000, 4);
  run_both(ctx, "large-raw", n,
           [&](std::uint32_t task) { return memory_test2_as_written(ctx, "large-raw", task, n); });
}

void run_strings_as_written(Context& ctx) {
  const std::uint64_t repeats = ctx.scaled(1000, 300);
  run_both(ctx, "strings-raw", 1, [&](std::uint32_t) { return string_test_as_written(ctx, repeats); });
}

}  // namespace brisk::stress
