// What a free block carries, and why it is safe to leave in memory a program may read or
// overwrite (a use after free, an overflow of the block before it).
//
// One 64x64->128-bit multiply of (address ^ offset) by an odd multiplier, both secret, gives
//   - the low half: the free key, kept in word 1 while the block is free, so a second free of
//     it is seen in one compare. A live block's word 1 is 0, and the key never is: offset has
//     its top bit set (so address ^ offset != 0 for any user address) and an odd multiplier is
//     invertible modulo 2^64.
//   - the high half: the link mask. Word 0 holds the next block XOR this mask (glibc 2.32's
//     "safe-linking", keyed with the secret rather than with address bits alone). The
//     multiplier's top bit is set: two block addresses differ by 16 or more after the xor with
//     offset (their lowest differing bit is bit 4 or above), so their products differ by at
//     least 2^67 and their masks by at least 7 (with a small multiplier, neighbouring blocks
//     would often share a mask).
// One observed key and its address do not give the secret: for every odd multiplier there is
// an offset that fits them, and each pair predicts other blocks' keys differently. Nor does a
// key give the link mask of its block (the other half of the product). So a program that reads
// freed memory cannot forge a free key, and an overwritten link decodes to an address nobody
// chose, which alloc_small (threadcache/heap.h) and the remote-chain walks (chain_next in
// threadcache/remote_free.cc) catch.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/hints.h"
#include "core/span.h"

namespace brisk {

struct FreeSecret {
  std::uint64_t offset = 0;      // top bit set
  std::uint64_t multiplier = 0;  // odd
};
// Set once, before the first block is handed out (threadcache process_init).
inline constinit FreeSecret g_free_secret{};

struct FreeCode {
  std::uintptr_t key;
  std::uintptr_t link_mask;
};

BRISK_ALWAYS_INLINE FreeCode free_code(std::uintptr_t address) {
  std::uint64_t x = address ^ g_free_secret.offset;
  if constexpr (!kEncodeFreeLinks) return FreeCode{x * g_free_secret.multiplier, 0};
  unsigned __int128 m = static_cast<unsigned __int128>(x) * g_free_secret.multiplier;
  return FreeCode{static_cast<std::uintptr_t>(m), static_cast<std::uintptr_t>(m >> 64)};
}

BRISK_ALWAYS_INLINE std::uintptr_t free_key(const void* p) {
  return free_code(reinterpret_cast<std::uintptr_t>(p)).key;
}

BRISK_ALWAYS_INLINE void set_link(Block* b, const Block* next, std::uintptr_t link_mask) {
  b->link = reinterpret_cast<std::uintptr_t>(next) ^ link_mask;
}
BRISK_ALWAYS_INLINE void set_link(Block* b, const Block* next) {
  set_link(b, next, free_code(reinterpret_cast<std::uintptr_t>(b)).link_mask);
}
// The decoded link, unchecked: a damaged one is an arbitrary value.
BRISK_ALWAYS_INLINE std::uintptr_t decoded_link(const Block* b, std::uintptr_t link_mask) {
  return b->link ^ link_mask;
}
BRISK_ALWAYS_INLINE std::uintptr_t decoded_link(const Block* b) {
  return decoded_link(b, free_code(reinterpret_cast<std::uintptr_t>(b)).link_mask);
}

}  // namespace brisk
