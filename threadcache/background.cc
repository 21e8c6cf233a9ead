// The background thread. See background.h.
//
// What it returns, each pass: the free pages of every chunk that stayed unused for
// BRISK_PURGE_DELAY_MS (chunk_decay_all: whoever owns the chunk, abandoned ones too), blocks
// in the orphan queue, and empty abandoned chunks. All of it through the same protocols any
// thread uses (claim before decommit, the central pools' locks), so it never touches a span a
// thread holds: heaps' current spans and free lists stay their owners' alone.
//
// When a pass finds nothing left to age, the thread backs off, doubling its sleep up to
// BRISK_IDLE_MS, so an idle process wakes it a few times a second at most; while memory is
// being freed it passes every purge delay (at least kMinSleepMs).
#include "threadcache/background.h"

#include <atomic>

#include "core/chunk.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"
#include "threadcache/heap.h"
#include "threadcache/orphans.h"

namespace brisk {
namespace {

constexpr std::uint64_t kMinSleepMs = 20;

// 0: not started; 1: starting or running.
std::atomic<int> g_state{0};
std::atomic<std::size_t> g_bytes_returned{0};

// The pass's own state, under g_pass_lock (a test may call background_pass beside the thread).
SpinLock g_pass_lock;
std::uint64_t g_last_decay_ms = 0;
std::uint64_t g_backoff_ms = kMinSleepMs;

void* background_main(void*) {
  platform::name_this_thread("brisk-bg");
  for (;;) {
    std::uint64_t sleep = 1000;  // lever off (a strategy switch may turn it on again)
    if (options::get(options::Id::kBackground) != 0) sleep = background_pass(platform::now_ms());
    platform::sleep_ms(sleep);
  }
  return nullptr;
}

}  // namespace

void background_maybe_start() {
  if (g_state.load(std::memory_order_relaxed) != 0) return;
  if (stats::g.heaps_live.load(std::memory_order_relaxed) < 2) return;
  if (options::get(options::Id::kBackground) == 0) return;
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  if (!platform::start_thread(background_main, nullptr)) g_state.store(0, std::memory_order_relaxed);
}

void background_reset_in_child() { g_state.store(0, std::memory_order_relaxed); }
void background_locks_acquire() { g_pass_lock.lock(); }
void background_locks_release() { g_pass_lock.unlock(); }
void background_locks_reset_in_child() { g_pass_lock.reset_after_fork(); }

std::size_t background_bytes_returned() { return g_bytes_returned.load(std::memory_order_relaxed); }

std::uint64_t background_pass(std::uint64_t now) {
  LockGuard g(g_pass_lock);
  auto delay = static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  auto idle = static_cast<std::uint64_t>(options::get(options::Id::kIdleMs));
  std::size_t bytes = 0;
  if (!g_orphan_heap.incoming.empty()) drain_orphans();
  chunk_destroy_empty_abandoned();
  bool pending = true;
  if (now - g_last_decay_ms >= delay) {
    bytes += chunk_decay_all(&pending);
    bytes += large_cache_decay(now, &pending);
    g_last_decay_ms = now;
  }
  g_bytes_returned.fetch_add(bytes, std::memory_order_relaxed);
  if (pending || bytes != 0) {
    g_backoff_ms = kMinSleepMs;
    return delay > kMinSleepMs ? delay : kMinSleepMs;
  }
  std::uint64_t sleep = g_backoff_ms;
  g_backoff_ms = sleep * 2 < idle ? sleep * 2 : idle;
  return sleep;
}

}  // namespace brisk
