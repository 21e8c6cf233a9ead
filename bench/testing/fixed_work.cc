// brisk-bench-fixed-work: a workload for brisk-compare's own tests. It allocates and frees small
// blocks until a fixed wall-clock time has passed, so its run time does not depend on the
// allocator or on how much CPU a busy machine grants it; then prints "ops_per_sec=N".
//   --ms N     how long to work (default 50)
//   --fail     exit with status 3 instead (a failing workload)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  long milliseconds = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ms") == 0 && i + 1 < argc) {
      milliseconds = std::strtol(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--fail") == 0) {
      std::fprintf(stderr, "fixed-work: failing as asked\n");
      return 3;
    } else {
      std::fprintf(stderr, "usage: brisk-bench-fixed-work [--ms N] [--fail]\n");
      return 2;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(milliseconds);
  unsigned long operations = 0;
  void* volatile sink = nullptr;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 64; ++i) {
      sink = std::malloc(16 + (operations % 64) * 8);
      std::free(sink);
      ++operations;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fixed-work: %lu operations\n", operations);
  std::printf("ops_per_sec=%.0f\n", static_cast<double>(operations) / seconds);
  return 0;
}
