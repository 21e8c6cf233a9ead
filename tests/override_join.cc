// pthread_join and C11's thrd_join under LD_PRELOAD=libbrisk.so park the joining thread's heap
// (override/threads.cc, threadcache/heap_lifecycle.cc "Parked heaps"):
//   - the main thread allocates, starts a thread and joins it (pthread_join, then thrd_join);
//     the thread frees those blocks
//     and allocates as many of its own, which must land in the main thread's spans (before
//     parked heaps they came from fresh memory while the frees waited in the main thread's
//     queue);
//   - a thread cancelled while it waits in pthread_join gives its heap back at exit.
// Exits 1 with a message on a failure; alarm(60) turns a hang into one.
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <threads.h>
#include <unistd.h>

#include <brisk/brisk.h>

#include <atomic>
#include <set>
#include <vector>

namespace {

constexpr size_t kSize = 200;
constexpr int kCount = 8192;

using GetStatsFn = void (*)(brisk_stats*);
GetStatsFn g_get_stats = nullptr;

uint64_t HeapsLive() {
  brisk_stats s;
  memset(&s, 0, sizeof s);
  g_get_stats(&s);
  return s.heaps_live;
}

// The 64 KiB page of a small block: a span's pages are 64 KiB aligned in their chunk.
uintptr_t PageOf(const void* p) { return reinterpret_cast<uintptr_t>(p) >> 16; }

// Whether thread tid of this process is sleeping (in a system call: pthread_join's futex wait).
bool Sleeping(pid_t tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  FILE* f = fopen(path, "r");
  if (f == nullptr) return false;
  char line[512] = {};
  bool sleeping = fgets(line, sizeof line, f) != nullptr && strstr(line, ") S ") != nullptr;
  fclose(f);
  return sleeping;
}

struct Shared {
  pid_t main_tid;
  std::vector<void*> blocks;
  std::set<uintptr_t> pages;
  int reused = 0;
  bool intact = true;
};

void* FreeAndAllocate(void* arg) {
  auto* s = static_cast<Shared*>(arg);
  // Free once the main thread waits in pthread_join and its heap is past the take time
  // (kParkedTakeAfterMs, 10 ms, on a clock of a few ms' resolution).
  while (!Sleeping(s->main_tid)) usleep(1000);
  usleep(40 * 1000);
  for (void* p : s->blocks) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < kSize; ++i) s->intact &= b[i] == 0x3c;
    free(p);
  }
  std::vector<void*> mine;
  for (int i = 0; i < kCount; ++i) {
    void* p = malloc(kSize);
    if (p == nullptr) return nullptr;
    memset(p, 0x5d, kSize);
    s->reused += s->pages.count(PageOf(p)) != 0 ? 1 : 0;
    mine.push_back(p);
  }
  for (void* p : mine) free(p);
  return nullptr;
}

int Fail(const char* what) {
  fprintf(stderr, "override_join: %s\n", what);
  return 1;
}

int pipe_fds[2];
void* WaitForPipe(void*) {
  char c;
  return read(pipe_fds[0], &c, 1) == 1 ? nullptr : reinterpret_cast<void*>(1);
}
std::atomic<bool> g_waiting{false};
void* JoinForever(void* other) {
  void* p = malloc(kSize);  // the thread has a heap to park
  memset(p, 1, kSize);
  g_waiting.store(true);
  pthread_join(*static_cast<pthread_t*>(other), nullptr);  // cancelled here
  free(p);
  return nullptr;
}

}  // namespace

int main() {
  alarm(60);
  g_get_stats = reinterpret_cast<GetStatsFn>(dlsym(RTLD_DEFAULT, "brisk_get_stats"));
  if (g_get_stats == nullptr) return Fail("brisk_get_stats not found (is LD_PRELOAD set?)");

  for (bool c11 : {false, true}) {
    Shared s;
    s.main_tid = static_cast<pid_t>(syscall(SYS_gettid));
    for (int i = 0; i < kCount; ++i) {
      void* p = malloc(kSize);
      if (p == nullptr) return Fail("malloc returned NULL");
      memset(p, 0x3c, kSize);
      s.blocks.push_back(p);
      s.pages.insert(PageOf(p));
    }
    if (c11) {
      thrd_t t;
      if (thrd_create(&t, [](void* a) { return FreeAndAllocate(a) == nullptr ? 0 : 1; }, &s) != thrd_success)
        return Fail("thrd_create failed");
      if (thrd_join(t, nullptr) != thrd_success) return Fail("thrd_join failed");
    } else {
      pthread_t t;
      if (pthread_create(&t, nullptr, FreeAndAllocate, &s) != 0) return Fail("pthread_create failed");
      if (pthread_join(t, nullptr) != 0) return Fail("pthread_join failed");
    }
    if (!s.intact) return Fail("a block was damaged before its free");
    printf("%s: reused %d of %d blocks allocated after the frees\n", c11 ? "thrd_join" : "pthread_join", s.reused, kCount);
    if (s.reused < kCount * 3 / 4) return Fail("the freeing thread did not reuse the joining thread's spans");
  }

  // Cancelled in pthread_join: the thread's key destructor unparks its heap and gives it back.
  const uint64_t live = HeapsLive();
  if (pipe(pipe_fds) != 0) return Fail("pipe failed");
  pthread_t waiter, joiner;
  if (pthread_create(&waiter, nullptr, WaitForPipe, nullptr) != 0) return Fail("pthread_create failed");
  if (pthread_create(&joiner, nullptr, JoinForever, &waiter) != 0) return Fail("pthread_create failed");
  while (!g_waiting.load()) usleep(1000);
  usleep(20 * 1000);
  pthread_cancel(joiner);
  void* result = nullptr;
  if (pthread_join(joiner, &result) != 0 || result != PTHREAD_CANCELED) return Fail("the joiner was not cancelled");
  // The waiter has a heap too (its first allocation may come from read's cancellation setup
  // or none): count only the joiner, which is gone.
  const uint64_t after = HeapsLive();
  if (write(pipe_fds[1], "x", 1) != 1) return Fail("write failed");
  pthread_join(waiter, nullptr);
  printf("heaps live: %llu before the joiner, %llu after it was cancelled\n", static_cast<unsigned long long>(live),
         static_cast<unsigned long long>(after));
  if (after > live) return Fail("the cancelled joiner's heap was not given back");
  return 0;
}
