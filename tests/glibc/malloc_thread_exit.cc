// Port of glibc's malloc/tst-malloc-thread-exit: two outer threads each start and join, over
// and over, four inner threads behind a barrier; half allocate before the barrier and free
// after it, half allocate after it, so threads exit while others are starting to allocate
// (glibc: races on its arena free list; brisk: heaps recycled while others are taken). glibc's
// runs for a fixed time; this runs a fixed number of rounds, and checks every block's contents.
#include <pthread.h>
#include <stdlib.h>

#include <atomic>

#include "tests/glibc/port.h"

namespace {

constexpr int kInner = 4;
constexpr int kRounds = 250;
constexpr size_t kSize = 32;
std::atomic<int> g_damaged{0};

__attribute__((noinline)) void FreeChecked(unsigned char* p, unsigned char value) {
  for (size_t i = 0; i < kSize; ++i)
    if (p[i] != value) {
      g_damaged++;
      break;
    }
  free(p);
}

unsigned char* AllocateFilled(unsigned char value) {
  auto* p = static_cast<unsigned char*>(malloc(kSize));
  if (p == nullptr) abort();
  memset(p, value, kSize);
  return p;
}

void* MallocFirst(void* closure) {
  unsigned char* p = AllocateFilled(0xa1);
  pthread_barrier_wait(static_cast<pthread_barrier_t*>(closure));
  FreeChecked(p, 0xa1);
  return nullptr;
}

void* WaitFirst(void* closure) {
  pthread_barrier_wait(static_cast<pthread_barrier_t*>(closure));
  FreeChecked(AllocateFilled(0xb2), 0xb2);
  return nullptr;
}

void* Outer(void*) {
  for (int round = 0; round < kRounds; ++round) {
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, nullptr, kInner + 1);
    pthread_t threads[kInner];
    for (int i = 0; i < kInner; ++i)
      if (pthread_create(&threads[i], nullptr, i % 2 == 0 ? MallocFirst : WaitFirst, &barrier) != 0) abort();
    pthread_barrier_wait(&barrier);
    for (int i = 0; i < kInner; ++i) pthread_join(threads[i], nullptr);
    pthread_barrier_destroy(&barrier);
  }
  return nullptr;
}

}  // namespace

int main() {
  port::Start("tst-malloc-thread-exit", 60);
  pthread_t outer[2];
  for (auto& t : outer) PORT_CHECK(pthread_create(&t, nullptr, Outer, nullptr) == 0, "pthread_create failed");
  for (auto& t : outer) pthread_join(t, nullptr);
  PORT_CHECK(g_damaged.load() == 0, "%d blocks damaged", g_damaged.load());
  return port::Finish();
}
