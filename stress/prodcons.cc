// Producer/consumer: P producers allocate blocks of mixed sizes, fill them and hand them to C
// consumers through a moodycamel::ConcurrentQueue; the consumers verify and free them. Every
// block is therefore freed by a thread that did not allocate it, the remote-free path of a
// thread-caching allocator. One block in four comes from calloc and is checked to be zero first.
#include <concurrentqueue/concurrentqueue.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "stress/pattern.h"
#include "stress/rng.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "prodcons";
// Bounds the bytes in flight so a slow consumer side cannot make RSS grow with the run length.
constexpr std::int64_t kMaxBytesInFlight = 64ll << 20;
constexpr std::size_t kBulk = 64;

// A server-like size mix: mostly small, some medium, a few large.
std::size_t mixed_size(Rng& rng) {
  const std::uint64_t r = rng.below(1000);
  if (r < 700) return rng.between(1, 256);
  if (r < 950) return rng.between(257, 8192);
  if (r < 995) return rng.between(8193, 256 * 1024);
  return rng.between(256 * 1024 + 1, 2 * 1024 * 1024);
}

struct Shared {
  moodycamel::ConcurrentQueue<Block> queue;
  std::atomic<std::int64_t> bytes_in_flight{0};
  // The most bytes in flight any producer saw right after adding a block (the count rises only
  // there): the workload's own live data at its peak, which the row's note reports with the
  // mean over those moments, so that an allocator's peak RSS can be read against them.
  std::atomic<std::int64_t> most_in_flight{0};
  std::atomic<std::int64_t> sum_in_flight_kib{0};  // over every produced block: the mean's sum
  std::atomic<std::uint64_t> consumed{0};
  std::uint64_t total = 0;
  std::uint64_t base = 0;
};

void produce(Context& ctx, Shared& shared, std::uint32_t producer, std::uint64_t count) {
  Rng rng(ctx.options.seed, 0x50000 + producer);
  moodycamel::ProducerToken token(shared.queue);
  std::int64_t most = 0;  // this producer's view of the high-water mark
  std::int64_t sum_kib = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    while (shared.bytes_in_flight.load(std::memory_order_relaxed) > kMaxBytesInFlight)
      std::this_thread::yield();
    Block b;
    b.size = mixed_size(rng);
    b.id = BlockId{producer, i, 0};
    b.hash = pattern_hash(shared.base, b.id);
    const bool zeroed = i % 4 == 3;
    b.ptr = zeroed ? std::calloc(1, b.size) : std::malloc(b.size);
    if (b.ptr == nullptr) fail_verify(kName, b.id, 0, zeroed ? "calloc returned NULL" : "malloc returned NULL");
    if (zeroed) verify_zero(kName, b, "after calloc");
    fill_pattern(b);
    const auto size = static_cast<std::int64_t>(b.size);
    const std::int64_t now = shared.bytes_in_flight.fetch_add(size, std::memory_order_relaxed) + size;
    if (now > most) most = now;
    sum_kib += now >> 10;
    shared.queue.enqueue(token, b);
    if (i % 256 == 255) ctx.progress.advance(256);
  }
  shared.sum_in_flight_kib.fetch_add(sum_kib, std::memory_order_relaxed);
  std::int64_t seen = shared.most_in_flight.load(std::memory_order_relaxed);
  while (most > seen && !shared.most_in_flight.compare_exchange_weak(seen, most, std::memory_order_relaxed)) {
  }
}

void consume(Context& ctx, Shared& shared) {
  moodycamel::ConsumerToken token(shared.queue);
  Block items[kBulk];
  while (shared.consumed.load(std::memory_order_acquire) < shared.total) {
    const std::size_t n = shared.queue.try_dequeue_bulk(token, items, kBulk);
    if (n == 0) {
      std::this_thread::yield();
      continue;
    }
    std::int64_t bytes = 0;
    for (std::size_t k = 0; k < n; ++k) {
      verify_pattern(kName, items[k], "before free by a consumer");
      bytes += static_cast<std::int64_t>(items[k].size);
      std::free(items[k].ptr);
    }
    shared.bytes_in_flight.fetch_sub(bytes, std::memory_order_relaxed);
    shared.consumed.fetch_add(n, std::memory_order_acq_rel);
  }
}

}  // namespace

std::uint64_t prodcons_traffic(Context& ctx, int producers, int consumers, std::uint64_t per_producer,
                               InFlight* in_flight) {
  Shared shared;
  shared.total = per_producer * producers;
  shared.base = workload_base(ctx.options.seed, kName);
  std::vector<std::thread> pool;
  for (int c = 0; c < consumers; ++c) pool.emplace_back([&] { consume(ctx, shared); });
  for (int p = 0; p < producers; ++p)
    pool.emplace_back([&, p] { produce(ctx, shared, static_cast<std::uint32_t>(p), per_producer); });
  for (std::thread& t : pool) t.join();
  if (in_flight != nullptr) {
    in_flight->most_kib = shared.most_in_flight.load(std::memory_order_relaxed) >> 10;
    in_flight->mean_kib = shared.sum_in_flight_kib.load(std::memory_order_relaxed) /
                          static_cast<std::int64_t>(shared.total > 0 ? shared.total : 1);
  }
  return 2 * shared.total;
}

void run_prodcons(Context& ctx) {
  const int threads = ctx.threads() < 2 ? 2 : ctx.threads();
  const int producers = threads / 2;
  const int consumers = threads - producers;
  const std::uint64_t per_producer = ctx.scaled(400000, 4000, 256);

  ctx.progress.begin("prodcons x" + std::to_string(threads), per_producer * producers);
  InFlight in_flight;
  ctx.recorder.measure(kName, threads,
                       [&] { return prodcons_traffic(ctx, producers, consumers, per_producer, &in_flight); });
  ctx.progress.end();
  // In soak mode the row sums passes; its note tells the last pass's bytes in flight.
  Row& row = ctx.recorder.last_row(kName, threads);
  row.note = std::to_string(producers) + " producers, " + std::to_string(consumers) + " consumers; in flight " +
             std::to_string(in_flight.mean_kib) + " KiB on average, " + std::to_string(in_flight.most_kib) +
             " KiB at most";
}

}  // namespace brisk::stress
