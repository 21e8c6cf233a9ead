// Remote frees: blocks freed by a thread that does not own their span travel to the owner in
// batches (one per destination heap, kRemoteSlots at a time) through the owner's RemoteQueue,
// or to the orphan queue when the owner has exited. This path allocates nothing.
#pragma once

#include <atomic>
#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// The owner's half of the asymmetric Dekker fence that lets another thread take an idle heap's
// outgoing batches and foreign cache (heap_take_outgoing; the protocol is described in
// remote_free.cc): set around every change the owner makes to them without the slow lock.
inline void out_busy_begin(Heap* h) {
  store_shared(h->out_busy, std::uint8_t{1});
  std::atomic_signal_fence(std::memory_order_seq_cst);
}
inline void out_busy_end(Heap* h) { std::atomic_ref<std::uint8_t>(h->out_busy).store(0, std::memory_order_release); }

// Sends the chain first..last (linked, encoded; bytes: their block sizes) to dest's queue, or
// to the orphan queue if dest has exited.
void send_chain(Heap* dest, Block* first, Block* last, std::size_t bytes);
// Adds b (size bytes) to h's outgoing batch for dest; a full batch is sent.
void outgoing_add(Heap* h, Heap* dest, Block* b, std::size_t size);
// A medium block (s, owned by the live heap owner) that h frees: gives s's pages back to their
// chunk at once if owner's slow lock is free; false: not done, send the block as usual.
bool free_remote_medium(Heap* h, Heap* owner, Span* s);
void heap_flush_outgoing(Heap* h);                // sends every partial batch
// By another thread holding h's slow lock (the background pass for an idle heap, brisk_trim):
// sends h's partial batches and its foreign cache's blocks, unless h's owner is changing one
// of them just now (remote_free.cc). Returns the bytes sent.
std::size_t heap_take_outgoing(Heap* h);
void heap_drain_incoming(Heap* h);                // takes and frees what others sent to h
void heap_process_blocks(Heap* h, Block* chain);  // frees a chain sent to h
// Test hooks, null in production (tests/batch_take_test.cc sets them to stage the interleaving
// of an append and a take): switch_destination calls the first with its heap once it has read
// the slot's old destination and sent its batch, before it installs the new one;
// heap_take_outgoing calls the second with the heap once its barrier has run, before it reads
// out_busy.
extern std::atomic<void (*)(Heap* h)> g_switch_destination_test_hook;
extern std::atomic<void (*)(Heap* h)> g_take_outgoing_test_hook;
// Test hook, null in production: free_remote_medium calls it with the owner once it holds the
// owner's slow lock, so a test can hold that lock there (tests/fork_heap_lock_test.cc).
extern std::atomic<void (*)(Heap* owner)> g_remote_medium_test_hook;
// Counts a chain of `bytes` taken from a queue (stats::Stripe::remote_queued_bytes).
void note_chain_taken(std::size_t bytes);
// The next block of a chain of remote frees, checked: a chain crosses spans and chunks, so a
// sound link is null or a 16-byte aligned address in a brisk chunk. Inline: the foreign cache's
// take (foreign_cache.h) makes it once per allocation it serves.
BRISK_ALWAYS_INLINE Block* chain_next(const Block* b) {
  std::uintptr_t next = decoded_link(b);
  if (kEncodeFreeLinks && next != 0 && ((next & (kMinAlign - 1)) != 0 || region_kind(next) != kRegionChunk))
    free_list_damaged(b);
  return reinterpret_cast<Block*>(next);
}

}  // namespace brisk
