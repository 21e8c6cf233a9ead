// realloc of debug blocks: the checks before it, resizing a block where it is, and the end of
// it (the old block freed, or live again). The entry layer's realloc (override/entry.cc) calls
// them in that order; block.h has the contract.
#include <cstring>

#include "core/chunk.h"
#include "core/large.h"
#include "core/size_class.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/block_ops.h"
#include "debug/debug_heap.h"
#include "debug/report.h"
#include "debug/snapshot.h"
#include "threadcache/medium.h"

namespace brisk::debug {

namespace {

// check_before_realloc of a pointer header_of placed in no debug heap (as block.cc's
// release_unplaced).
BRISK_NOINLINE ReallocCheck realloc_unplaced(const void* p, const Header* h, bool in_debug_memory) {
  if (h == nullptr) {
    if (!in_debug_memory) return ReallocCheck::kNotDebug;
    problem_at("realloc of a pointer that is no debug block", p);
    return ReallocCheck::kBad;
  }
  header_damaged(h);
  return ReallocCheck::kBad;
}

// check_before_realloc of a block its fast path found not live and intact, or not a malloc
// block: decided again under the lock, and reported after it.
BRISK_NOINLINE ReallocCheck realloc_checked(DebugHeap* d, Header* h, std::size_t* user_size, std::uint32_t stack) {
  Snapshot s;
  bool live = false;
  {
    LiveLock g(d);
    FillDamage damage;
    std::uint64_t mix;
    if (h->state != State::kLive) {
      take_snapshot(&s, "realloc of a freed block", h, nullptr);
    } else if (const char* problem = damage_of(h, &damage, &mix)) {
      take_snapshot(&s, problem, h, &damage);
      unlink_live(d, h);
      h->state = State::kKept;  // never reused
      seal(h);
    } else {
      live = true;
      mark_freed(d, h, mix, stack, State::kQuarantined);
      if (const char* misuse = kind_mismatch(h->kind, Kind::kMalloc)) take_snapshot(&s, misuse, h, nullptr);
    }
    *user_size = h->user_size;
  }
  if (s.problem != nullptr) problem_found(s);
  return live ? ReallocCheck::kLive : ReallocCheck::kBad;
}

}  // namespace

ReallocCheck check_before_realloc(void* p, std::size_t* user_size) {
  bool in_debug_memory;
  DebugHeap* d;
  Header* h = find_header(p, &in_debug_memory, &d);
  if (BRISK_UNLIKELY(h == nullptr || d == nullptr)) return realloc_unplaced(p, h, in_debug_memory);
  const std::uint32_t stack = capture(0, Site::kRealloc);
  {
    LiveLock g(d);
    // The common case inline, as release's: a live, intact malloc block. Freed here, under the
    // lock: the caller copies it and hands it to realloc_done (which takes the lock again to
    // put a moved block into its heap's batch), so the free after the copy repeats neither the
    // lookup nor the checks.
    std::uint64_t mix;
    if (BRISK_LIKELY(live_and_intact(h, &mix) && kinds_match(h->kind, Kind::kMalloc))) {
      mark_freed(d, h, mix, stack, State::kQuarantined);
      *user_size = h->user_size;
      return ReallocCheck::kLive;
    }
  }
  return realloc_checked(d, h, user_size, stack);
}

bool realloc_in_place(void* p, std::size_t size) {
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(p) - kHeaderBytes);
  BRISK_ASSERT(h->state == State::kQuarantined);
  constexpr std::size_t kLimit = static_cast<std::size_t>(PTRDIFF_MAX) / 2;  // allocate's
  if (size == 0 || size > kLimit || g_realloc_moves.load(std::memory_order_relaxed)) return false;
  // The bytes of the underlying block the resized debug block takes: its alignment slack and
  // header, the user data and the canary.
  char* u = underlying_of(h);
  const std::size_t need = static_cast<std::size_t>(user_of(h) - u) + size + kGuardBytes;
  auto ua = reinterpret_cast<std::uintptr_t>(u);
  std::uint8_t kind = region_kind(ua);
  // The bounds of the entry layer's realloc of release blocks (override/entry.cc), so that a
  // block shrunk in debug mode keeps no more than it would in release mode: a small block stays
  // while it fits and fills more than half of its class; a medium run grows into free pages
  // after it (a claim any holder may make) or gives back the pages past its new end while it
  // needs more than a small block; a large block stays above kGrowLargeMin.
  if (kind == kRegionChunk) {
    Span* s = chunk_of(ua)->span_of(ua);
    bool fits = s->kind == SpanKind::kSmall ? stays_in_small_block(need, s->block_size)
                                            : need > kSmallMax && need <= kMediumMax && medium_resize_in_place(s, need);
    if (!fits) return false;
  } else {
    LargeHeader* lh = large_header_of(u, kind);
    if (need <= kGrowLargeMin || lh == nullptr || !large_resize_in_place(u, lh, need)) return false;
  }
  const std::size_t old_size = h->user_size;
  // Held by this thread and in no list (check_before_realloc): no other thread reads the
  // header until realloc_done links it again and seals it (a program that frees or reallocates
  // the block on another thread meanwhile races with its own realloc; that free finds it freed).
  // As for a block realloc moves: a malloc block now (a misused new block was reported at
  // check_before_realloc), made at the realloc's stack on this thread (mark_freed recorded both
  // as the free's).
  h->user_size = size;
  h->edges_only = fill_edges_only(size);  // a block that grew past the fill limit, or shrank below
  h->kind = Kind::kMalloc;
  h->alloc_thread = h->free_thread;
  h->alloc_stack = h->free_stack;
  if (size > old_size) fill_user(h, kAllocByte, old_size);  // over the old canary too
  std::memset(user_of(h) + size, kGuardByte, kGuardBytes);
  return true;
}

void realloc_done(void* p, bool moved) {
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(p) - kHeaderBytes);
  BRISK_ASSERT(h->state == State::kQuarantined);
  DebugHeap* d = heap_of(h);
  if (moved) {
    // Into its heap's batch, as a free of it would go (one lock, instead of a shard's per block).
    QuarantinedBlock out[DebugHeap::kFreedBatch + 1];
    std::size_t n = 0;
    bool batched;
    {
      LiveLock g(d);
      batched = batch_freed(d, h, out, &n);
    }
    quarantine_released(h, batched, out, n);
    return;
  }
  // No new block: p stays the program's, live again.
  LiveLock g(d);
  h->free_thread = 0;
  h->free_stack = kNoStack;
  link_live(d, h);
  h->state = State::kLive;
  seal(h);
}

}  // namespace brisk::debug
