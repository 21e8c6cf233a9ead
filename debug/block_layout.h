// A debug block's header, and the debug layer's state shared by the files that read headers
// (block.cc: blocks; leaks.cc: the leak report; heap_check.cc: brisk_check_heap). Internal to
// debug/; the layout is drawn in the README ("Debug mode").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/hints.h"
#include "debug/block.h"
#include "debug/quarantine.h"
#include "debug/stack_trace.h"

namespace brisk::debug {

struct DebugHeap;
struct FillDamage;

enum class State : std::uint8_t { kLive = 1, kQuarantined = 2, kKept = 3 };

struct Header {
  std::uint64_t check;  // kMagic ^ user address while live, quarantined or kept; else 0
  Header* prev;         // heap's live list, under its live_lock
  Header* next;
  std::uint64_t user_size;
  std::uint64_t sequence;
  std::uint32_t alloc_thread;
  std::uint32_t free_thread;  // 0 while live
  std::uint32_t alloc_stack;
  std::uint32_t free_stack;
  std::uint32_t heap_id;            // the id of the debug heap that made the block; its live_lock guards state
  std::uint32_t underlying_offset;  // bytes from the block this one is carved from to the header (< kMaxAlignment)
  Kind kind;
  State state;
  bool edges_only;  // patterns on the first and last kFillEdgeBytes only (the fill limit)
  std::uint8_t reserved;
  std::uint32_t checksum;  // over every field but check, prev, next and itself
  std::uint8_t guard[kGuardBytes];
};
static_assert(offsetof(Header, guard) + kGuardBytes == sizeof(Header), "the guard ends at the user data");
// The header's checksum, sealed at allocation and free and checked at free, at quarantine exit
// and by brisk_check_heap. It covers the header from user_size to the flags as six words (five
// of 8 bytes, the flags' 4; two 4-byte fields share a word, in x86-64's byte order), each
// rotated by its own amount (a bijection) and xored: a change to any one field changes the
// result, and rotations not a multiple of 8 (each a different one mod 8) keep a byte pattern
// written over the header from cancelling out. One multiply at the end (mix_checksum) spreads
// every bit over the upper half. A chain of a multiply per field cost 49 instructions each; a
// load and a rotation per field about 15 more per checksum than a word at a time (callgrind).
//
// Rotation distributes over xor, so the mix is the xor of a part for the fields a free sets
// (free_thread, free_stack, state: free_mix) and a part for the rest, fixed at allocation. A
// free that has just verified the checksum turns the verified mix into the freed block's with
// two free_mix terms, instead of a third pass over the header (block_ops.h's mark_freed).
// Allocation seals from the values it stores (mix_words), not by loading them back: an 8-byte
// load of two 4-byte fields just written cannot be forwarded from the stores, and stalled (perf:
// half of the function's time on one such load).
static_assert(offsetof(Header, sequence) == offsetof(Header, user_size) + 8 &&
                  offsetof(Header, alloc_thread) == offsetof(Header, user_size) + 16 &&
                  offsetof(Header, free_thread) == offsetof(Header, alloc_thread) + 4 &&
                  offsetof(Header, alloc_stack) == offsetof(Header, user_size) + 24 &&
                  offsetof(Header, free_stack) == offsetof(Header, alloc_stack) + 4 &&
                  offsetof(Header, heap_id) == offsetof(Header, user_size) + 32 &&
                  offsetof(Header, underlying_offset) == offsetof(Header, heap_id) + 4 &&
                  offsetof(Header, kind) == offsetof(Header, user_size) + 40 &&
                  offsetof(Header, state) == offsetof(Header, kind) + 1 &&
                  offsetof(Header, edges_only) == offsetof(Header, kind) + 2 &&
                  offsetof(Header, reserved) == offsetof(Header, kind) + 3,
              "mix_of reads the checked fields as six words, in this order");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a field's place in its word (mix_words)");
BRISK_ALWAYS_INLINE std::uint64_t rotate_left(std::uint64_t v, int bits) { return (v << bits) | (v >> (64 - bits)); }
// A constant in the mix: an all-zero header would otherwise have checksum 0 and pass.
inline constexpr std::uint64_t kMixSeed = 0x5DEECE66Dull;
BRISK_ALWAYS_INLINE std::uint64_t mix_words(std::uint64_t user_size, std::uint64_t sequence, std::uint64_t threads,
                                            std::uint64_t stacks, std::uint64_t ids, std::uint32_t flags) {
  return kMixSeed ^ rotate_left(user_size, 11) ^ rotate_left(sequence, 22) ^ rotate_left(threads, 33) ^
         rotate_left(stacks, 44) ^ rotate_left(ids, 55) ^ rotate_left(flags, 5);
}
// Two 4-byte fields as the word that holds them, low first.
BRISK_ALWAYS_INLINE std::uint64_t pair_word(std::uint32_t low, std::uint32_t high) {
  return std::uint64_t{low} | std::uint64_t{high} << 32;
}
// The flags' word (kind, state, edges_only, reserved, first to last).
BRISK_ALWAYS_INLINE std::uint32_t flags_word(Kind kind, State state, bool edges_only, std::uint8_t reserved) {
  return std::uint32_t{static_cast<std::uint8_t>(kind)} | std::uint32_t{static_cast<std::uint8_t>(state)} << 8 |
         std::uint32_t{edges_only} << 16 | std::uint32_t{reserved} << 24;
}
BRISK_ALWAYS_INLINE std::uint64_t free_mix(std::uint32_t free_thread, std::uint32_t free_stack, State state) {
  return rotate_left(pair_word(0, free_thread), 33) ^ rotate_left(pair_word(0, free_stack), 44) ^
         rotate_left(flags_word(Kind{}, state, false, 0), 5);
}
BRISK_ALWAYS_INLINE std::uint64_t mix_of(const Header* h) {
  const char* at = reinterpret_cast<const char*>(&h->user_size);
  std::uint64_t w[5];
  std::uint32_t flags;
  std::memcpy(w, at, sizeof w);
  std::memcpy(&flags, at + sizeof w, sizeof flags);
  return mix_words(w[0], w[1], w[2], w[3], w[4], flags);
}
BRISK_ALWAYS_INLINE std::uint32_t mix_checksum(std::uint64_t mix) {
  return static_cast<std::uint32_t>((mix * 0x9E3779B97F4A7C15ull) >> 32);
}
BRISK_ALWAYS_INLINE std::uint32_t checksum_of(const Header* h) { return mix_checksum(mix_of(h)); }
// After fields changed in place (realloc, a kept block): loads them back.
BRISK_ALWAYS_INLINE void seal(Header* h) { h->checksum = checksum_of(h); }

// The user data, right after the header.
inline char* user_of(const Header* h) { return reinterpret_cast<char*>(const_cast<Header*>(h)) + sizeof(Header); }
// The block this one is carved from (read from a header whose checksum was verified).
inline char* underlying_of(const Header* h) {
  return reinterpret_cast<char*>(const_cast<Header*>(h)) - h->underlying_offset;
}

// Every captured stack, stored once (block_ops.h's capture).
extern StackDepot g_depot;

// Freed debug blocks waiting before their memory is reused (block.cc), and the two ways through
// it for quarantine_flush.cc: blocks (marked kQuarantined, filled with the freed pattern) go in,
// oldest first, and the blocks they push out are checked and freed; blocks taken out are each
// checked and freed (leave_quarantine). kEvictBatch: the blocks taken out at a time.
extern Quarantine g_quarantine;
inline constexpr std::size_t kEvictBatch = 32;
void push_to_quarantine(const QuarantinedBlock* blocks, std::size_t n);
void leave_quarantine_all(const QuarantinedBlock* blocks, std::size_t n);
// debug::init's progress: 0 not started, 1 running, 2 done.
extern std::atomic<int> g_init_state;

// Reading blocks (block.cc), for the heap check (heap_check.cc) too.
// The debug block whose user pointer is p, or nullptr. *in_debug_memory: p lies in memory that
// holds debug blocks (so a failed lookup is a bad pointer, not a release block). *heap, with a
// block: the debug heap whose live_lock guards it (nullptr: its header is damaged).
Header* header_of(const void* p, bool* in_debug_memory, DebugHeap** heap);
// What is wrong with a live block's own bytes (header, guard, canary), or nullptr. *mix, when
// asked for: the header's mix_of as read.
const char* damage_of(const Header* h, FillDamage* damage, std::uint64_t* mix = nullptr);
// The same for a quarantined block, its freed pattern too.
const char* quarantined_damage(const Header* h, FillDamage* damage);
// A block whose header names no debug heap: reported, and left where it is.
void header_damaged(const Header* h);
// The heap check's lock (heap_check.cc), for the fork handlers: taken first of the debug
// layer's, since its holder runs report callbacks, which may allocate.
void check_lock_acquire();
void check_lock_release();
void check_lock_reset_in_child();

}  // namespace brisk::debug
