// The free key must not give away the process secret: a program that reads one freed block's
// key word (say, in the uninitialised memory of a fresh block laid over recycled ones) must not
// be able to compute the key of another block, and so can neither forge a "free" block nor
// make a live block's free abort.
#include "core/free_key.h"

#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace brisk {
namespace {

std::uintptr_t KeyWordOf(const void* p) {
  std::uintptr_t w;
  std::memcpy(&w, static_cast<const char*>(p) + sizeof(std::uintptr_t), sizeof w);
  return w;
}

TEST(FreeKey, OneLeakedKeyDoesNotPredictTheKeyOfAnotherFreedBlock) {
  constexpr int kBlocks = 64;
  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(48));
  void* keep = brisk_malloc(48);  // keeps the span in use while the others are free
  for (void* p : blocks) brisk_free(p);
  // The key word each freed block carries, read the way a program reading freed memory would.
  std::vector<std::uintptr_t> keys;
  for (void* p : blocks) keys.push_back(KeyWordOf(p));
  auto a0 = reinterpret_cast<std::uintptr_t>(blocks[0]);
  ASSERT_EQ(keys[0], free_key(blocks[0])) << "the key word is not where the test reads it";
  int predicted = 0;
  for (int i = 1; i < kBlocks; ++i) {
    auto a = reinterpret_cast<std::uintptr_t>(blocks[i]);
    // secret ^ address: one key XOR its address gave the secret, and with it every key.
    if ((keys[0] ^ a0 ^ a) == keys[i]) ++predicted;
  }
  EXPECT_EQ(predicted, 0) << "of " << kBlocks - 1 << " keys";
  brisk_free(keep);
}

TEST(FreeKey, IsNeverZeroAndDiffersFromTheLinkMask) {
  brisk_free(brisk_malloc(16));  // initialises the process secret
  ASSERT_NE(g_free_secret.multiplier, 0u);
  // Keeps the link masks of neighbouring blocks apart (core/free_key.h).
  EXPECT_EQ(g_free_secret.multiplier >> 63, 1u);
  std::uintptr_t addresses[] = {0, 16, 4096, std::uintptr_t{1} << 46, (std::uintptr_t{1} << 47) - 16,
                                g_free_secret.offset & ((std::uintptr_t{1} << 47) - 16)};
  for (std::uintptr_t a : addresses) {
    FreeCode c = free_code(a);
    EXPECT_NE(c.key, 0u) << a;  // 0 is a live block's key word
    if (kEncodeFreeLinks) EXPECT_NE(c.link_mask, c.key) << a;
  }
}

TEST(FreeKey, LinksRoundTripAndDependOnTheBlockAddress) {
  brisk_free(brisk_malloc(16));
  alignas(16) Block blocks[2];
  Block target{};
  set_link(&blocks[0], &target);
  set_link(&blocks[1], &target);
  EXPECT_EQ(decoded_link(&blocks[0]), reinterpret_cast<std::uintptr_t>(&target));
  EXPECT_EQ(decoded_link(&blocks[1]), reinterpret_cast<std::uintptr_t>(&target));
  set_link(&blocks[0], nullptr);
  EXPECT_EQ(decoded_link(&blocks[0]), 0u);
  if (kEncodeFreeLinks) {
    // The stored word is neither the pointer nor the same for two blocks linking to one target.
    set_link(&blocks[0], &target);
    EXPECT_NE(blocks[0].link, reinterpret_cast<std::uintptr_t>(&target));
    EXPECT_NE(blocks[0].link, blocks[1].link);
  }
}

}  // namespace
}  // namespace brisk
