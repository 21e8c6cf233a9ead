// A cross-thread free chain after xmalloc-test (Lever and Boreham, "malloc() Performance in a
// Multithreaded Linux Environment", USENIX 2000), written afresh, with the object size
// mimalloc-bench runs it with (64 B) and the original's batches of 4,096 objects. The original
// pairs allocating threads with freeing threads through one shared queue; here the threads form
// a ring: thread i allocates batches and hands each to thread i+1, and frees the batches thread
// i-1 handed to it. On many threads every object is freed by a thread that did not allocate it;
// on one thread the ring closes on itself and every free is local. The batch record is itself
// allocated by the producer and freed by the consumer, as in the original. Every object is
// filled when allocated and checked before it is freed.
//
// Runs on one thread, then on --threads threads.
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "stress/parallel.h"
#include "stress/pattern.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "xmalloc";
constexpr std::size_t kObjectSize = 64;
constexpr std::uint32_t kBatchObjects = 4096;
// A thread frees its predecessor's batch k - kLag right after handing on its own batch k. It
// only ever waits for a batch that the predecessor hands on before waiting itself, so the ring
// cannot deadlock, and no thread gets more than threads * kLag batches ahead of another.
constexpr std::uint64_t kLag = 2;

struct Batch {
  Batch* next;
  std::uint32_t producer;
  std::uint64_t number;
  void* objects[kBatchObjects];
};

// The batches one thread hands to the next, in the order handed on.
class Link {
 public:
  void push(Batch* batch) {
    batch->next = nullptr;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      (tail_ == nullptr ? head_ : tail_->next) = batch;
      tail_ = batch;
    }
    ready_.notify_one();
  }

  Batch* pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return head_ != nullptr; });
    Batch* batch = head_;
    head_ = batch->next;
    if (head_ == nullptr) tail_ = nullptr;
    return batch;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  Batch* head_ = nullptr;
  Batch* tail_ = nullptr;
};

Block object_block(std::uint64_t base, std::uint32_t producer, std::uint64_t number, std::uint32_t index) {
  Block b;
  b.size = kObjectSize;
  b.id = BlockId{producer, number, index};
  b.hash = pattern_hash(base, b.id);
  return b;
}

Batch* make_batch(std::uint64_t base, std::uint32_t producer, std::uint64_t number) {
  void* record = std::malloc(sizeof(Batch));
  if (record == nullptr) fail_verify(kName, BlockId{producer, number, 0}, 0, "malloc returned NULL");
  auto* batch = new (record) Batch;
  batch->producer = producer;
  batch->number = number;
  for (std::uint32_t i = 0; i < kBatchObjects; ++i)
    batch->objects[i] = new_block(kName, base, BlockId{producer, number, i}, kObjectSize).ptr;
  return batch;
}

// Checks that the batch is the one expected next on this link, then checks and frees it.
void free_batch(std::uint64_t base, Batch* batch, std::uint32_t producer, std::uint64_t number) {
  if (batch->producer != producer || batch->number != number)
    fail_verify(kName, BlockId{producer, number, 0}, 0, "batch handed on out of order");
  for (std::uint32_t i = 0; i < kBatchObjects; ++i) {
    Block b = object_block(base, producer, number, i);
    b.ptr = batch->objects[i];
    free_block(kName, b, "before free by the next thread");
  }
  batch->~Batch();
  std::free(batch);
}

// One row: returns its operation count.
std::uint64_t run_ring(std::uint64_t base, int threads, std::uint64_t batches, Progress& progress) {
  // links[i] carries thread i-1's batches to thread i.
  std::unique_ptr<Link[]> links(new Link[static_cast<std::size_t>(threads)]);
  return run_on_threads(threads, [&](std::uint32_t task) {
    const auto n = static_cast<std::uint32_t>(threads);
    const std::uint32_t predecessor = (task + n - 1) % n;
    for (std::uint64_t k = 0; k < batches; ++k) {
      links[(task + 1) % n].push(make_batch(base, task, k));
      if (k >= kLag) free_batch(base, links[task].pop(), predecessor, k - kLag);
      progress.advance(1);
    }
    for (std::uint64_t k = batches > kLag ? batches - kLag : 0; k < batches; ++k)
      free_batch(base, links[task].pop(), predecessor, k);
    return batches * (2 * std::uint64_t{kBatchObjects} + 2);
  });
}

}  // namespace

void run_xmalloc(Context& ctx) {
  const std::uint64_t batches = ctx.scaled(100, 3);
  const std::uint64_t base = workload_base(ctx.options.seed, kName);
  measure_rows(ctx, kName, batches, std::to_string(batches) + " batches of 4096 x 64 B per thread",
               [&](int threads) { return run_ring(base, threads, batches, ctx.progress); });
}

}  // namespace brisk::stress
