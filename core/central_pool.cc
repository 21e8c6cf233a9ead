#include "core/central_pool.h"

#include "core/span_holes.h"
#include "core/stats.h"

namespace brisk {

CentralPool g_central[kCentralPools];
std::atomic<std::size_t> CentralPool::g_kept_span_bytes{0};

Span* central_take(unsigned c, Heap* new_owner) {
  CentralPool& pool = g_central[c];
  // An unlocked peek keeps threads off the lock while the pool is empty, the common case.
  if (!pool.nonempty.load(std::memory_order_relaxed)) return nullptr;
  LockGuard g(pool.lock);
  Span* s = pool.available.head;
  if (s != nullptr) {
    pool.remove(s);
  } else {
    s = pool.kept_head;
    if (s == nullptr) return nullptr;
    pool.remove_kept(s);
  }
  BRISK_ASSERT(s->kind == SpanKind::kSmall && s->size_class == c && s->has_room());
  // Before it has an owner, whose frees would not look for holes (core/span_holes.h).
  if (s->hole_pages != 0) span_fill_holes(s);
  s->owner.store(new_owner, std::memory_order_release);
  stats::add(&stats::Stripe::spans_orphaned, -1);
  return s;
}

void central_locks_acquire() {
  for (auto& p : g_central) p.lock.lock();
}
void central_locks_release() {
  for (auto& p : g_central) p.lock.unlock();
}
void central_locks_reset_in_child() {
  for (auto& p : g_central) p.lock.reset_after_fork();
}

}  // namespace brisk
