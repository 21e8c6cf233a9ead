// Buffers that grow by realloc, the way a server builds a large response or reads a file of
// unknown size: `--buffers` slots; each of `--steps` steps picks a random slot and either starts
// a buffer of 8 bytes, grows it by a random 1/16 to 1/2 of its size (plus up to 100 bytes) and
// writes every new byte, or, once it holds `--max-kib` KiB, checks it and frees it. Before each
// growth the buffer's last byte and one byte per 64 KiB are checked against what was written.
// It calls no allocator API, so it runs under any allocator, preloaded:
//
//   LD_PRELOAD=libbrisk.so brisk-grow-loop [--buffers 8] [--max-kib 4096] [--steps 100000]
//
// Exit status: 0, 1 if a buffer lost its contents or realloc failed, 2 on wrong usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cli.h"

namespace {

constexpr const char* kTool = "brisk-grow-loop";
constexpr const char* kSynopsis = "[--buffers N] [--max-kib N] [--steps N]";

constexpr unsigned long kMaxCount = 100000000;

struct Buffer {
  unsigned char* data = nullptr;
  std::size_t size = 0;
  unsigned generation = 0;
};

// The byte written at offset i of a buffer of this generation.
unsigned char byte_at(unsigned generation, std::size_t i) {
  return static_cast<unsigned char>((i >> 12) * 31 + generation * 7 + 1);
}

bool intact(const Buffer& b) {
  for (std::size_t at = 0; at < b.size; at += 64 << 10)
    if (b.data[at] != byte_at(b.generation, at)) return false;
  return b.data[b.size - 1] == byte_at(b.generation, b.size - 1);
}

void write_from(Buffer& b, std::size_t from) {
  // Runs of one value per 4 KiB page, so the writing is a memset per page.
  for (std::size_t at = from; at < b.size;) {
    std::size_t page_end = ((at >> 12) + 1) << 12;
    std::size_t end = page_end < b.size ? page_end : b.size;
    std::memset(b.data + at, byte_at(b.generation, at), end - at);
    at = end;
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned long buffers = 8, max_kib = 4096, steps = 100000;
  brisk::bench::parse_counts(argc, argv, kTool, kSynopsis,
                             {{"--buffers", &buffers, kMaxCount},
                              {"--max-kib", &max_kib, kMaxCount},
                              {"--steps", &steps, kMaxCount}});
  const std::size_t max_size = static_cast<std::size_t>(max_kib) << 10;
  std::vector<Buffer> slot(buffers);
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> slot_of(0, buffers - 1);
  unsigned generation = 0;
  for (unsigned long step = 0; step < steps; ++step) {
    Buffer& b = slot[slot_of(rng)];
    if (b.data == nullptr) {
      b.size = 8;
      b.generation = ++generation;
      b.data = static_cast<unsigned char*>(std::malloc(b.size));
      if (b.data == nullptr) {
        std::fprintf(stderr, "brisk-grow-loop: step %lu: malloc(8) failed\n", step);
        return 1;
      }
      write_from(b, 0);
      continue;
    }
    if (!intact(b)) {
      std::fprintf(stderr, "brisk-grow-loop: step %lu: a %zu-byte buffer lost its contents\n", step, b.size);
      return 1;
    }
    if (b.size >= max_size) {
      std::free(b.data);
      b = Buffer{};
      continue;
    }
    std::uniform_int_distribution<std::size_t> grow_of(b.size / 16, b.size / 2);
    std::size_t next = b.size + grow_of(rng) + 1 + rng() % 100;
    if (next > max_size) next = max_size;
    auto* grown = static_cast<unsigned char*>(std::realloc(b.data, next));
    if (grown == nullptr) {
      std::fprintf(stderr, "brisk-grow-loop: step %lu: realloc to %zu bytes failed\n", step, next);
      return 1;
    }
    std::size_t old = b.size;
    b.data = grown;
    b.size = next;
    write_from(b, old);
  }
  for (Buffer& b : slot) std::free(b.data);
  std::printf("buffers=%lu max_kib=%lu steps=%lu\n", buffers, max_kib, steps);
  return 0;
}
