// Snapshots: see snapshot.h.
#include "debug/snapshot.h"

#include <cstdlib>
#include <cstring>

#include "debug/block.h"
#include "debug/stack_trace.h"

namespace brisk::debug {

std::atomic<bool> g_keep_going{false};

void take_snapshot(Snapshot* s, const char* problem, const Header* h, const FillDamage* damage) {
  s->problem = problem;
  s->user = user_of(h);
  s->user_size = h->user_size;
  s->alloc_thread = h->alloc_thread;
  s->free_thread = h->free_thread;
  s->alloc_stack = h->alloc_stack;
  s->free_stack = h->free_stack;
  s->has_damage = damage != nullptr && damage->range_count > 0;
  if (s->has_damage) s->damage = *damage;
  // The dump covers the user data and the canary: an overrun shows.
  std::size_t n = h->user_size + kGuardBytes;
  s->dump_size = n < kDumpBytes ? n : kDumpBytes;
  std::memcpy(s->dump, user_of(h), s->dump_size);
}

void emit(const Snapshot& s) {
  BlockReport r;
  r.problem = s.problem;
  r.block = s.user;
  r.user_size = s.user_size;
  r.damage = s.has_damage ? &s.damage : nullptr;
  r.allocated.thread = s.alloc_thread;
  r.allocated.depth = g_depot.fetch(s.alloc_stack, &r.allocated.frames);
  r.freed.thread = s.free_thread;
  if (s.free_thread != 0) r.freed.depth = g_depot.fetch(s.free_stack, &r.freed.frames);
  r.dump = s.dump;
  r.dump_size = s.dump_size;
  report_problem(r);
}

void problem_found(const Snapshot& s) {
  emit(s);
  if (!g_keep_going.load(std::memory_order_relaxed)) std::abort();
}

void problem_at(const char* problem, const void* p) {
  Snapshot s;
  s.problem = problem;
  s.user = p;
  problem_found(s);
}

}  // namespace brisk::debug
