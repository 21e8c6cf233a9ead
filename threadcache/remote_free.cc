// Remote frees between heaps. See remote_free.h.
#include "threadcache/remote_free.h"

#include "core/chunk.h"
#include "core/report.h"

namespace brisk {

void send_chain(Heap* dest, Block* first, Block* last) {
  if (!dest->incoming.push(first, last)) {
    // The owner has exited (its queue is closed): its spans are, or are about to be, orphans.
    g_orphan_heap.incoming.push(first, last);
  }
}

namespace {

void flush_batch(OutgoingBatch& o) {
  if (o.count != 0) send_chain(o.dest, o.head, o.tail);
  o.head = o.tail = nullptr;
  o.count = 0;
  o.bytes = 0;
}

}  // namespace

void outgoing_add(Heap* h, Heap* dest, Block* b, std::size_t size) {
  OutgoingBatch& o = h->outgoing[dest->id & (kRemoteSlots - 1)];
  if (o.dest != dest) {
    flush_batch(o);
    o.dest = dest;
  }
  set_link(b, o.head);
  o.head = b;
  if (o.tail == nullptr) o.tail = b;
  o.bytes += size;
  if (++o.count >= kRemoteBatch || o.bytes >= h->batch_bytes) {
    flush_batch(o);
    heap_refresh_levers(h);
    // A thread that frees other threads' blocks without allocating (a consumer, or two workers
    // freeing each other's blocks) never reaches alloc_refill, which drains the queue; what
    // others freed into its spans would wait there, resident, until it allocated again.
    if (!h->incoming.empty()) {
      HeapSlowLock lock(h);
      heap_drain_incoming(h);
    }
  }
}

void heap_flush_outgoing(Heap* h) {
  for (auto& o : h->outgoing) flush_batch(o);
}

void heap_drain_incoming(Heap* h) { heap_process_blocks(h, h->incoming.take_all()); }

Block* chain_next(const Block* b) {
  std::uintptr_t next = decoded_link(b);
  if (kEncodeFreeLinks && next != 0 && ((next & (kMinAlign - 1)) != 0 || region_kind(next) != kRegionChunk))
    free_list_damaged(b);
  return reinterpret_cast<Block*>(next);
}

namespace {

// A block that arrived in h's queue. The span may have changed owner since it was sent.
void process_owned_block(Heap* h, Block* b) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  Span* s = chunk_of(a)->span_of(a);
  Heap* owner = s->owner.load(std::memory_order_acquire);
  if (owner != h) {
    if (owner == nullptr) fatal_pointer_error("invalid free of", b, "its span is not in use");
    send_chain(owner, b, b);
    return;
  }
  if (a - reinterpret_cast<std::uintptr_t>(s->start) >= s->carved_bytes)
    fatal_pointer_error("invalid free of", b, "never handed out");
  free_to_own_span(h, s, b, free_code(a));
}

}  // namespace

void heap_process_blocks(Heap* h, Block* b) {
  while (b != nullptr) {
    Block* next = chain_next(b);
    process_owned_block(h, b);
    b = next;
  }
}

}  // namespace brisk
