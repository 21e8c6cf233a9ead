// Debug heaps. See debug_heap.h and threadcache/debug_switch.h.
#include "debug/debug_heap.h"

#include <atomic>
#include <new>

#include "core/chunk.h"
#include "core/platform.h"
#include "debug/block_layout.h"
#include "threadcache/remote_free.h"

namespace brisk::debug {
namespace {

// Debug heaps live in slabs from the platform layer, never in malloc's memory, and are never
// unmapped: a remote free may reach the queue of a debug heap whose thread exited long ago.
SpinLock g_registry_lock;  // the slab and the registry's head
std::atomic<DebugHeap*> g_registry{nullptr};
char* g_slab_cursor = nullptr;
char* g_slab_end = nullptr;
std::uint32_t g_next_id = 1;
constexpr std::size_t kSlabBytes = 256 * 1024;
constexpr std::size_t kHeapBytes = (sizeof(DebugHeap) + BRISK_CACHELINE - 1) & ~std::size_t{BRISK_CACHELINE - 1};
static_assert(kHeapBytes <= kSlabBytes);

DebugHeap* make_debug_heap() {
  LockGuard g(g_registry_lock);
  if (g_slab_cursor == nullptr || g_slab_end - g_slab_cursor < static_cast<std::ptrdiff_t>(kHeapBytes)) {
    auto* slab = static_cast<char*>(platform::map(kSlabBytes));
    if (slab == nullptr) return nullptr;
    g_slab_cursor = slab;
    g_slab_end = slab + kSlabBytes;
  }
  auto* d = new (g_slab_cursor) DebugHeap();
  g_slab_cursor += kHeapBytes;
  // Outgoing batches are slotted by the destination's id: distinct ids spread the debug heaps.
  // Sparse (the count times an odd constant: distinct, never 0, and a permutation of the low
  // bits the slots use): a large debug block's header names its heap by id, and a small
  // integer written over it must not name another heap, whose lock and live list a report
  // would then take (heap_of in block.cc).
  d->id = g_next_id++ * 0x9E3779B1u;
  d->registry_next = g_registry.load(std::memory_order_relaxed);
  g_registry.store(d, std::memory_order_release);
  return d;
}

}  // namespace

BRISK_NOINLINE DebugHeap* make_debug_heap_of(Heap* h) {
  BRISK_ASSERT(heap_is_attached(h) && !h->is_debug && h->debug == nullptr);
  // Published with a release store: brisk_trim reads other heaps' debug heaps (process_trim).
  std::atomic_ref<Heap*>(h->debug).store(make_debug_heap(), std::memory_order_release);
  return static_cast<DebugHeap*>(h->debug);
}

DebugHeap* first_debug_heap() { return g_registry.load(std::memory_order_acquire); }

void free_in_debug_heap(char* u) {
  auto a = reinterpret_cast<std::uintptr_t>(u);
  Span* s = chunk_of(a)->span_of(a);
  auto* b = reinterpret_cast<Block*>(u);
  FreeCode code = free_code(a);
  // The span holds u, a live block, so its debug heap cannot give it away meanwhile.
  Heap* owner = s->owner.load(std::memory_order_acquire);
  BRISK_ASSERT(owner != nullptr && owner->is_debug);
  Heap* h = t_heap;
  bool attached = heap_is_attached(h);
  if (attached && owner == h->debug) {
    free_to_own_span(owner, s, b, code);
    return;
  }
  // In a remote chain a block carries the free key, as free_slow's remote frees leave it.
  std::atomic_ref<std::uintptr_t>(b->key).store(code.key, std::memory_order_relaxed);
  if (attached) {
    outgoing_add(h, owner, b, s->block_size);
  } else {
    send_chain(owner, b, b, s->block_size);
  }
}

BRISK_NOINLINE void link_full_made_ring(DebugHeap* d) { LiveLock g(d); }

void heaps_lock_all() {
  g_registry_lock.lock();
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) d->live_lock.lock();
}

void heaps_unlock_all() {
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) d->live_lock.unlock();
  g_registry_lock.unlock();
}

void heaps_reset_in_child() {
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) d->live_lock.reset_after_fork();
  g_registry_lock.reset_after_fork();
}

}  // namespace brisk::debug
