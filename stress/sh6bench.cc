// A mixed-size block stack after MicroQuill's SmartHeap benchmark sh6bench (as mimalloc-bench
// runs it: blocks of 1 to 1,000 B, 2,500 stack entries per thread), written afresh.
//
// Each thread walks a fixed size sequence again and again: base sizes 1, 2, 4, 7, 11, ... (each
// 1.5 times the last plus one) below 1,000 B, and for each base the sizes base, base/2, ..., 1,
// small ones more often (250 blocks of each size below 100 B, 50 below 1,000 B). Every block is
// pushed on the thread's stack. When the stack is full, one fifth of it, a window that moves up
// by a fifth each time, keeps its blocks through the next cycle; the entries below the window
// are freed in allocation order (FIFO) and those above it in reverse order (LIFO), and pushing
// starts again at the bottom, stepping over the window. Blocks are filled when pushed and
// checked when freed.
//
// Runs on one thread, then on --threads threads, each with its own stack.
#include <string>
#include <vector>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "sh6bench";
constexpr std::size_t kStackSlots = 2500;
constexpr std::size_t kWindow = kStackSlots / 5;
static_assert(kStackSlots % 5 == 0, "the window steps through the stack in whole fifths");
constexpr std::size_t kMaxBase = 1000;

constexpr std::size_t repeats_of(std::size_t size) { return size < 100 ? 250 : 50; }

// Blocks pushed per walk of the size sequence.
constexpr std::uint64_t blocks_per_walk() {
  std::uint64_t n = 0;
  for (std::size_t base = 1; base < kMaxBase; base = base * 3 / 2 + 1)
    for (std::size_t size = base; size != 0; size /= 2) n += repeats_of(size);
  return n;
}

class Stack {
 public:
  Stack(std::uint64_t base, std::uint32_t task) : base_(base), task_(task), slots_(kStackSlots) {}

  void push(std::size_t size, std::uint64_t number) {
    if (top_ == keep_begin_) top_ = keep_end_;
    if (top_ == kStackSlots) {
      recycle();
      if (top_ == keep_begin_) top_ = keep_end_;
    }
    slots_[top_] = new_block(kName, base_, BlockId{task_, number, static_cast<std::uint32_t>(top_)}, size);
    ++top_;
    ++ops_;
  }

  // Frees what is left, in allocation order; returns the operation count.
  std::uint64_t finish() {
    for (std::size_t i = 0; i < kStackSlots; ++i) release(i);
    return ops_;
  }

 private:
  // The window moves to the fifth after the last one (back to the bottom after the top fifth);
  // everything outside it is freed, below it FIFO, above it LIFO.
  void recycle() {
    keep_begin_ = keep_end_ >= kStackSlots ? 0 : keep_end_;
    keep_end_ = keep_begin_ + kWindow;
    for (std::size_t i = 0; i < keep_begin_; ++i) release(i);
    for (std::size_t i = kStackSlots; i > keep_end_; --i) release(i - 1);
    top_ = 0;
  }

  void release(std::size_t i) {
    if (slots_[i].ptr == nullptr) return;
    free_block(kName, slots_[i], "before free");
    slots_[i].ptr = nullptr;
    ++ops_;
  }

  std::uint64_t base_;
  std::uint32_t task_;
  std::vector<Block> slots_;
  std::size_t top_ = 0;
  // No window until the stack first fills.
  std::size_t keep_begin_ = kStackSlots;
  std::size_t keep_end_ = kStackSlots;
  std::uint64_t ops_ = 0;
};

std::uint64_t walk_sizes(Context& ctx, std::uint64_t base, std::uint32_t task, std::uint64_t walks) {
  Stack stack(base, task);
  std::uint64_t number = 0;
  for (std::uint64_t w = 0; w < walks; ++w) {
    for (std::size_t size_base = 1; size_base < kMaxBase; size_base = size_base * 3 / 2 + 1)
      for (std::size_t size = size_base; size != 0; size /= 2)
        for (std::size_t r = repeats_of(size); r != 0; --r) stack.push(size, number++);
    ctx.progress.advance(1);
  }
  return stack.finish();
}

}  // namespace

void run_sh6bench(Context& ctx) {
  const std::uint64_t walks = ctx.scaled(100, 1);
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  const std::string note =
      std::to_string(walks) + " walks of " + std::to_string(blocks_per_walk()) + " blocks per thread";
  measure_rows(ctx, kName, walks, note, [&](int threads) {
    return run_on_threads(threads, [&](std::uint32_t task) { return walk_sizes(ctx, base, task, walks); });
  });
}

}  // namespace brisk::stress
