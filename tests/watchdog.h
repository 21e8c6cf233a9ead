// A watchdog for a test run that must end: if it is still running after its limit, the
// process prints what it was doing and aborts, where a deadlock inside the allocator would
// otherwise wait for ctest's timeout and print nothing useful.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace brisk_test {

class Watchdog {
 public:
  // on_expiry(limit in seconds) says what the run was doing; the process aborts after it.
  Watchdog(std::chrono::seconds limit, void (*on_expiry)(long long seconds))
      : thread_([this, limit, on_expiry] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            on_expiry(static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace brisk_test
