// Helpers shared by brisk's black-box tests: fill patterns that let every block's contents be
// verified, and test sizes scaled down under sanitizers.
#ifndef BRISK_TESTS_TEST_UTIL_H
#define BRISK_TESTS_TEST_UTIL_H

#include <brisk/brisk.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>
#include <vector>

namespace brisk_test {

// Waits, polling each millisecond, until done() or `seconds` have passed; returns done().
template <class Pred>
bool WaitUntil(Pred done, int seconds = 20) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

// Waits until every atomic counter of `counters` is above zero, as WaitUntil.
template <class Counters>
bool WaitUntilEachCounted(const Counters& counters, int seconds = 20) {
  return WaitUntil(
      [&counters] {
        for (const auto& n : counters)
          if (n.load() == 0) return false;
        return true;
      },
      seconds);
}

// Waits up to `seconds` for the child process pid to end, polling every 10 ms; kills it
// (SIGKILL: a deadlock in a fork handler blocks every other signal) if it has not. True if it
// ended by itself; *status: its wait status either way.
inline bool WaitForChild(pid_t pid, int seconds, int* status) {
  pid_t done = 0;
  WaitUntil([&] { return done != 0 || (done = waitpid(pid, status, WNOHANG)) != 0; }, seconds);
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
  }
  return done == pid;
}

// This process's address space now (VmSize of /proc/self/status), or 0.
inline size_t AddressSpaceBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmSize: %zu kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}

// Runs body() in a child process whose address space may grow by `room` bytes at most
// (RLIMIT_AS: the commit limit of vm.overcommit_memory=2 and vm.max_map_count fail mappings the
// same way), which the limit cannot outlive. The child's exit status: body's result, 10 when
// VmSize cannot be read, 11 when setrlimit refuses; -1 when the child died of a signal.
template <class Body>
int ExitStatusUnderAddressLimit(size_t room, Body body) {
  const pid_t pid = fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    const size_t now = AddressSpaceBytes();
    if (now == 0) _exit(10);
    struct rlimit limit;
    limit.rlim_cur = limit.rlim_max = now + room;
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(11);
    _exit(body());
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// brisk's process-wide counters now.
inline brisk_stats Stats() {
  brisk_stats s;
  std::memset(&s, 0, sizeof s);
  brisk_get_stats(&s);
  return s;
}

// Whether the running kernel is Linux major.minor or later (uname's release, "6.1.0-..."),
// for tests of a feature the kernel gained in that release: there it must work, not be skipped.
inline bool KernelAtLeast(int major, int minor) {
  utsname u;
  int ma = 0, mi = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

// Whether transparent huge pages are on for every anonymous mapping ("[always]"): a first write
// may then bring in 2 MiB, and a test of which 4 KiB pages are resident cannot tell.
inline bool HugePagesAlways() {
  std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == nullptr) return false;
  char line[128] = {};
  bool always = std::fgets(line, sizeof line, f) != nullptr && std::strstr(line, "[always]") != nullptr;
  std::fclose(f);
  return always;
}

// Sanitizer builds are 3-20x slower; CMake defines BRISK_TEST_SANITIZED there so counts shrink
// and the suite stays within its time budget.
#ifdef BRISK_TEST_SANITIZED
inline constexpr int kScale = 4;
#else
inline constexpr int kScale = 1;
#endif

// A pattern byte that depends on the seed and the offset, so a block that was swapped with
// another, shifted, or partly overwritten by a free-list link shows up as a mismatch.
inline unsigned char PatternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (i >> 3) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x >> (8 * (i & 7)));
}

// The 8-byte word at word index w, equal to the bytes PatternByte would give (little endian).
inline uint64_t PatternWord(uint64_t seed, size_t w) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + w * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// Fills n bytes at p with the pattern for seed. Word-at-a-time so multi-MiB blocks stay cheap.
inline void Fill(void* p, size_t n, uint64_t seed) {
  unsigned char* b = static_cast<unsigned char*>(p);
  size_t words = n / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t v = PatternWord(seed, w);
    std::memcpy(b + 8 * w, &v, 8);
  }
  for (size_t i = words * 8; i < n; ++i) b[i] = PatternByte(seed, i);
}

// Returns the offset of the first byte that differs from the pattern, or SIZE_MAX if none does.
inline size_t FirstMismatch(const void* p, size_t n, uint64_t seed) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  size_t words = n / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t v;
    std::memcpy(&v, b + 8 * w, 8);
    if (v != PatternWord(seed, w)) {
      for (size_t i = 8 * w; i < 8 * w + 8; ++i)
        if (b[i] != PatternByte(seed, i)) return i;
    }
  }
  for (size_t i = words * 8; i < n; ++i)
    if (b[i] != PatternByte(seed, i)) return i;
  return SIZE_MAX;
}

inline bool Verify(const void* p, size_t n, uint64_t seed) { return FirstMismatch(p, n, seed) == SIZE_MAX; }

// Returns the offset of the first nonzero byte, or SIZE_MAX.
inline size_t FirstNonZero(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {  // word at a time; sanitizers make byte loops slow
    uint64_t v;
    std::memcpy(&v, b + i, 8);
    if (v != 0) break;
  }
  for (; i < n; ++i)
    if (b[i] != 0) return i;
  return SIZE_MAX;
}

inline bool IsAligned(const void* p, size_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) & (alignment - 1)) == 0;
}

// A small deterministic PRNG (splitmix64) so failures reproduce.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  uint64_t Below(uint64_t n) { return Next() % n; }
};

// A size mix that exercises small, medium and (rarely) large blocks.
inline size_t MixedSize(Rng& rng) {
  uint64_t r = rng.Below(1000);
  if (r < 720) return 1 + rng.Below(256);
  if (r < 969) return 257 + rng.Below(8 * 1024);
  if (r < 999) return 8 * 1024 + rng.Below(120 * 1024);
  return 256 * 1024 + rng.Below(2 * 1024 * 1024);
}

// The process's resident memory now (/proc/self/statm), in bytes; 0 if it cannot be read.
inline size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// Bytes of the blocks' pages that are resident; a page no longer mapped counts as not resident.
inline size_t ResidentIn(const std::vector<void*>& blocks, size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec(size / page + 2);
  size_t bytes = 0;
  for (void* p : blocks) {
    uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    size_t len = reinterpret_cast<uintptr_t>(p) + size - start;
    if (mincore(reinterpret_cast<void*>(start), len, vec.data()) != 0) continue;
    for (size_t i = 0; i < (len + page - 1) / page; ++i) bytes += (vec[i] & 1) * page;
  }
  return bytes;
}

// Frees, with free_fn, every block but the first of each brisk chunk (4 MiB, 4 MiB-aligned), so
// that no chunk empties and only page purging can return the freed pages. Returns the indices
// of the blocks kept.
template <class Free>
std::vector<size_t> KeepOneBlockPerChunk(const std::vector<void*>& blocks, Free free_fn) {
  std::vector<size_t> kept;
  std::vector<uintptr_t> chunks_seen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    uintptr_t chunk = reinterpret_cast<uintptr_t>(blocks[i]) & ~((uintptr_t{4} << 20) - 1);
    bool seen = false;
    for (uintptr_t c : chunks_seen) seen |= c == chunk;
    if (seen) {
      free_fn(blocks[i]);
    } else {
      chunks_seen.push_back(chunk);
      kept.push_back(i);
    }
  }
  return kept;
}

// The OS pages that hold a byte of a freed block and none of a kept one.
inline std::vector<uintptr_t> FreeOnlyPages(const std::vector<void*>& blocks, const std::vector<bool>& kept, size_t size) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<uintptr_t> live, freed;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto a = reinterpret_cast<uintptr_t>(blocks[i]);
    for (uintptr_t p = a & ~(page - 1); p < a + size; p += page) (kept[i] ? live : freed).push_back(p);
  }
  std::sort(live.begin(), live.end());
  std::sort(freed.begin(), freed.end());
  freed.erase(std::unique(freed.begin(), freed.end()), freed.end());
  std::vector<uintptr_t> only;
  std::set_difference(freed.begin(), freed.end(), live.begin(), live.end(), std::back_inserter(only));
  return only;
}
inline size_t ResidentPages(const std::vector<uintptr_t>& pages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t bytes = 0;
  for (uintptr_t p : pages) {
    unsigned char v = 0;
    if (mincore(reinterpret_cast<void*>(p), page, &v) == 0 && (v & 1) != 0) bytes += page;
  }
  return bytes;
}

// One block in 97 kept, the others freed: nearly every span keeps a live block, so neither a
// released span nor a chunk's free pages give anything back; the pages between live blocks
// are what remains to return (core/span_holes.h). Returns the blocks; kept[i] for those still live.
inline std::vector<void*> AllocateAndKeepOneIn97(size_t size, size_t total, std::vector<bool>* kept) {
  std::vector<void*> blocks(total / size);
  kept->assign(blocks.size(), false);
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i] = brisk_malloc(size);
    if (blocks[i] == nullptr) std::abort();
    Fill(blocks[i], size, i);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 97 == 0) (*kept)[i] = true; else brisk_free(blocks[i]);
  }
  return blocks;
}

}  // namespace brisk_test

#endif  // BRISK_TESTS_TEST_UTIL_H
