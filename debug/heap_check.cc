// brisk_check_heap and the check of one block: every live and quarantined debug block's header,
// guard, canary and (quarantined) freed pattern, read under the locks that guard them and
// reported after them.
#include "core/lock.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "debug/fill_check.h"
#include "debug/quarantine.h"
#include "debug/snapshot.h"

namespace brisk::debug {

int check_block(const void* p) {
  bool in_debug_memory;
  DebugHeap* d;
  Header* h = header_of(p, &in_debug_memory, &d);
  if (h == nullptr) return 0;
  if (d == nullptr) {
    header_damaged(h);
    return 1;
  }
  Snapshot s;
  {
    LiveLock g(d);
    FillDamage damage;
    if (h->state == State::kLive) {
      if (const char* problem = damage_of(h, &damage)) take_snapshot(&s, problem, h, &damage);
    } else if (h->state == State::kQuarantined) {
      if (const char* problem = quarantined_damage(h, &damage)) take_snapshot(&s, problem, h, &damage);
    }
  }
  if (s.problem == nullptr) return 0;
  emit(s);
  return 1;
}

namespace {
// check_heap's snapshots, under g_check_lock: a batch is too large for a thread's stack.
constexpr int kBatch = 8;
// Fair (core/lock.h): fork's prepare handler waits for it, behind at most the checks that
// asked before it, however often a thread checks.
TicketLock g_check_lock;
Snapshot g_check_batch[kBatch];
// Set while this thread holds g_check_lock in check_heap, where it runs report callbacks. A
// callback may fork: fork's handlers then leave the lock to this thread (check_lock_acquire
// and _release) instead of waiting for it, which was for ever.
__thread bool t_checking __attribute__((tls_model("initial-exec"))) = false;

class CheckScope {
 public:
  CheckScope() {
    g_check_lock.lock();
    t_checking = true;
  }
  ~CheckScope() {
    t_checking = false;
    g_check_lock.unlock();
  }
  CheckScope(const CheckScope&) = delete;
  CheckScope& operator=(const CheckScope&) = delete;
};
}  // namespace

int check_heap() {
  // From one of this check's own report callbacks: the lock is this thread's, and the batch
  // being reported is the one a nested check would fill.
  if (t_checking) return -1;
  // Snapshots are taken under the locks and reported after them, a batch at a time.
  CheckScope check_scope;
  int damaged = 0;
  int queued = 0;
  auto flush = [&queued] {
    for (int i = 0; i < queued; ++i) emit(g_check_batch[i]);
    queued = 0;
  };
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    {
      LiveLock g(d);
      for (Header* h = d->live; h != nullptr; h = h->next) {
        FillDamage damage;
        if (const char* problem = damage_of(h, &damage)) {
          if (queued < kBatch) take_snapshot(&g_check_batch[queued++], problem, h, &damage);
          ++damaged;
        }
      }
      for (unsigned i = 0; i < d->freed_count; ++i) {
        auto* h = static_cast<Header*>(d->freed[i].block);
        FillDamage damage;
        const char* problem = quarantined_damage(h, &damage);
        if (problem == nullptr) continue;
        if (queued < kBatch) take_snapshot(&g_check_batch[queued++], problem, h, &damage);
        ++damaged;
      }
    }
    flush();
  }
  struct Visit {
    int damaged = 0;
    int* queued;
  } visit{0, &queued};
  g_quarantine.for_each(
      [](const QuarantinedBlock& b, void* context) {
        auto* v = static_cast<Visit*>(context);
        auto* h = static_cast<Header*>(b.block);
        FillDamage damage;
        const char* problem = quarantined_damage(h, &damage);
        if (problem == nullptr) return;
        if (*v->queued < kBatch) take_snapshot(&g_check_batch[(*v->queued)++], problem, h, &damage);
        ++v->damaged;
      },
      &visit);
  flush();
  return damaged + visit.damaged;
}

void check_lock_acquire() {
  if (!t_checking) g_check_lock.lock();
}
void check_lock_release() {
  if (!t_checking) g_check_lock.unlock();
}
// The waiters' tickets are gone with their threads. A child forked by a callback goes on with
// the check, which unlocks at its end: the lock starts out held once, by it.
void check_lock_reset_in_child() {
  g_check_lock.reset_after_fork();
  if (t_checking) g_check_lock.lock();
}

}  // namespace brisk::debug
