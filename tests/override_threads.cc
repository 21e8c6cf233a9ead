// A thread-heavy program linked without brisk and run with LD_PRELOAD=libbrisk.so: std::thread,
// new/delete of objects and strings, containers handed between threads and deleted there, and
// threads that exit while their objects live on. Exits 1 on any damaged object or if new and
// malloc were not brisk's.
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<long> g_bad{0};

struct Message {
  uint64_t id;
  std::string text;
  std::vector<uint64_t> numbers;
  explicit Message(uint64_t i)
      : id(i), text(static_cast<size_t>(i % 500), static_cast<char>('a' + i % 26)), numbers(i % 64, i * 3) {}
  bool Intact() const {
    if (text.size() != id % 500 || numbers.size() != id % 64) return false;
    for (char c : text)
      if (c != static_cast<char>('a' + id % 26)) return false;
    for (uint64_t n : numbers)
      if (n != id * 3) return false;
    return true;
  }
};

class Channel {
 public:
  void Send(std::unique_ptr<Message> m) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(m));
    cv_.notify_one();
  }
  std::unique_ptr<Message> Receive() {  // nullptr once closed and empty
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return nullptr;
    auto m = std::move(q_.front());
    q_.pop_front();
    return m;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Message>> q_;
  bool closed_ = false;
};

bool InBrisk(const char* symbol) {
  void* sym = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  return sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr &&
         strstr(info.dli_fname, "libbrisk.so") != nullptr;
}

}  // namespace

int main() {
  for (const char* s : {"malloc", "free", "_Znwm", "_ZdlPvm", "_ZdlPv"}) {
    if (!InBrisk(s)) {
      fprintf(stderr, "override_threads: %s is not served by libbrisk.so (is LD_PRELOAD set?)\n", s);
      return 1;
    }
  }
  using UsableSizeFn = size_t (*)(const void*);
  auto brisk_usable = reinterpret_cast<UsableSizeFn>(dlsym(RTLD_DEFAULT, "brisk_usable_size"));
  if (brisk_usable == nullptr) {
    fprintf(stderr, "override_threads: brisk_usable_size not found\n");
    return 1;
  }

  constexpr int kProducers = 4, kConsumers = 4, kPerProducer = 20000;
  Channel channel;
  std::atomic<long> received{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&] {
      std::map<uint64_t, std::string> seen;  // a node container growing on this thread
      while (auto m = channel.Receive()) {
        if (!m->Intact()) g_bad++;
        if (brisk_usable(m.get()) < sizeof(Message)) g_bad++;
        if (m->id % 97 == 0) seen.emplace(m->id, m->text);
        received++;
        // m (allocated on a producer thread) is deleted here.
      }
      for (auto& [id, text] : seen)
        if (text.size() != id % 500) g_bad++;
    });
  }
  // Short-lived producers: each exits while its messages are still queued or being read.
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) channel.Send(std::make_unique<Message>(uint64_t(p) * kPerProducer + i));
    });
  }
  for (auto& t : producers) t.join();
  // Objects allocated on threads that have exited, freed by a fresh wave of threads.
  std::vector<Message*> orphans;
  std::mutex orphans_mu;
  for (int wave = 0; wave < 20; ++wave) {
    std::thread([&, wave] {
      std::lock_guard<std::mutex> lock(orphans_mu);
      for (int i = 0; i < 500; ++i) orphans.push_back(new Message(uint64_t(wave) * 1000 + i));
    }).join();
  }
  std::thread([&] {
    for (Message* m : orphans) {
      if (!m->Intact()) g_bad++;
      delete m;
    }
  }).join();
  channel.Close();
  for (auto& t : consumers) t.join();

  if (received != long{kProducers} * kPerProducer) {
    fprintf(stderr, "override_threads: received %ld of %ld messages\n", received.load(),
            long{kProducers} * kPerProducer);
    return 1;
  }
  if (g_bad != 0) {
    fprintf(stderr, "override_threads: %ld damaged objects\n", g_bad.load());
    return 1;
  }
  printf("override_threads: %ld messages and %zu orphans checked\n", received.load(), orphans.size());
  return 0;
}
