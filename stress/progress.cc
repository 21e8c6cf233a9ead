// The progress bar: a drawing thread that redraws one stderr line ten times a second. It exists
// only when stderr is a terminal, so logs, ctest and brisk-compare never see it.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "stress/suite.h"

namespace brisk::stress {

Progress::Progress() : enabled_(isatty(STDERR_FILENO) == 1) {
  if (enabled_) drawer_ = std::thread([this] { draw_loop(); });
}

Progress::~Progress() {
  if (!enabled_) return;
  stop_.store(true);
  drawer_.join();
  std::fputs("\r\033[K", stderr);
}

void Progress::begin(const std::string& label, std::uint64_t total_units) {
  if (!enabled_) return;
  active_.store(false);
  // The drawer reads label_ only while active_ is true and after seeing label_version_ change,
  // so this write does not race with a draw in progress.
  while (label_version_.load() % 2 == 1) std::this_thread::yield();
  label_ = label;
  done_.store(0);
  total_.store(total_units == 0 ? 1 : total_units);
  active_.store(true);
}

void Progress::end() {
  if (!enabled_) return;
  active_.store(false);
  while (label_version_.load() % 2 == 1) std::this_thread::yield();
  std::fputs("\r\033[K", stderr);
}

void Progress::draw_loop() {
  using namespace std::chrono_literals;
  while (!stop_.load()) {
    std::this_thread::sleep_for(100ms);
    label_version_.fetch_add(1);  // odd: drawing
    if (active_.load()) {
      const std::uint64_t total = total_.load();
      std::uint64_t done = done_.load(std::memory_order_relaxed);
      if (done > total) done = total;
      const int width = 30;
      const int filled = static_cast<int>(width * done / total);
      char bar[width + 1];
      for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
      bar[width] = '\0';
      std::fprintf(stderr, "\r\033[Kbrisk-stress %-24s [%s] %3d%%", label_.c_str(), bar,
                   static_cast<int>(100 * done / total));
      std::fflush(stderr);
    }
    label_version_.fetch_add(1);  // even: idle
  }
}

}  // namespace brisk::stress
