// The idle-server pattern (issue 10): worker threads allocate a working set of mixed blocks
// (16 B-2 KiB, and one in eight 4-64 KiB), touching every byte; each frees the blocks another
// worker allocated; then all stay alive and idle, blocked on a condition variable, as a
// server's pool threads do. The main thread samples the process's resident memory at the peak
// and at given times after the frees, and prints each sample as a fraction of the peak. It calls
// no allocator API (unless --trim: malloc_trim(0) right after the frees), so it runs under any
// allocator, preloaded. --shuffle: each worker frees the other's blocks in a random order, not
// in the order they were made (in debug mode the last blocks freed wait in the quarantine, and
// then lie in every span instead of a few):
//
//   LD_PRELOAD=libbrisk.so brisk-idle-server [--mib 1024] [--threads 2] [--at 1000,5000] [--trim] [--shuffle]
//
// bench/idle/idle_table.sh runs it under every peer. Output: one line, key=value pairs.
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

std::size_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

struct Barrier {
  std::mutex m;
  std::condition_variable cv;
  int waiting = 0, generation = 0, count;
  explicit Barrier(int n) : count(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    int gen = generation;
    if (++waiting == count) {
      waiting = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return gen != generation; });
    }
  }
};

std::uint64_t next(std::uint64_t& s) {  // xorshift64*
  s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
  return s * 2685821657736338717ull;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 1024;
  int threads = 2;
  bool trim = false, shuffle = false;
  std::vector<int> at_ms{1000, 5000};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--trim") trim = true;
    else if (a == "--shuffle") shuffle = true;
    else if (a == "--at" && i + 1 < argc) {
      at_ms.clear();
      for (char* p = argv[++i]; *p != '\0';) {
        at_ms.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
        else if (*p != '\0') return std::fprintf(stderr, "bad --at\n"), 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--threads N] [--at MS,MS...] [--trim] [--shuffle]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 2) threads = 2;
  std::vector<std::vector<void*>> blocks(threads);
  for (auto& v : blocks) v.reserve(mib * 1024 * 1024 / threads / 4000 + 1024);
  Barrier allocated(threads + 1), freed(threads + 1);
  std::mutex idle_m;
  std::condition_variable idle_cv;
  bool stop = false;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::uint64_t seed = 0x9e3779b97f4a7c15ull * (t + 1);
      std::size_t target = mib * 1024 * 1024 / threads, got = 0;
      auto& mine = blocks[t];
      while (got < target) {
        std::uint64_t r = next(seed);
        std::size_t size = (r & 7) == 0 ? 4096 + (r >> 8) % (60 * 1024) : 16 + (r >> 8) % 2033;
        void* p = std::malloc(size);
        if (p == nullptr) std::abort();
        std::memset(p, static_cast<int>(t + 1), size);
        mine.push_back(p);
        got += size;
      }
      allocated.wait();
      auto& theirs = blocks[(t + 1) % threads];  // another worker's blocks, this worker's alone now
      if (shuffle)
        for (std::size_t i = theirs.size(); i > 1; --i) std::swap(theirs[i - 1], theirs[next(seed) % i]);
      for (void* p : theirs) std::free(p);
      freed.wait();
      std::unique_lock<std::mutex> lock(idle_m);
      idle_cv.wait(lock, [&] { return stop; });  // alive and idle
    });
  }
  allocated.wait();
  std::size_t peak = resident_bytes();
  freed.wait();
  auto t0 = std::chrono::steady_clock::now();
  if (trim) malloc_trim(0);
  std::size_t after_free = resident_bytes();
  std::printf("peak_mib=%.1f after_free=%.3f", peak / 1048576.0, static_cast<double>(after_free) / peak);
  for (int ms : at_ms) {
    std::this_thread::sleep_until(t0 + std::chrono::milliseconds(ms));
    std::printf(" at_%dms=%.3f", ms, static_cast<double>(resident_bytes()) / peak);
  }
  std::printf("\n");
  {
    std::lock_guard<std::mutex> lock(idle_m);
    stop = true;
  }
  idle_cv.notify_all();
  for (auto& w : workers) w.join();
  for (auto& v : blocks) v.clear();
  return 0;
}
