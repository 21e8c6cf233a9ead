// Frees that glibc makes after a thread's pthread key destructors have run, under
// LD_PRELOAD=libbrisk.so: __libc_thread_freeres frees the strerror buffer of an unknown errno,
// the strsignal buffer of a real-time signal and the dlerror message, after brisk's key
// destructor has detached the thread's heap. Thousands of short threads that each leave such a
// buffer must not leave a heap, a chunk or resident memory behind. Exits 1 with the counters
// if they do.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <brisk/brisk.h>

namespace {

using GetStatsFn = void (*)(brisk_stats*);
GetStatsFn g_get_stats = nullptr;

brisk_stats Stats() {
  brisk_stats s;
  memset(&s, 0, sizeof s);
  g_get_stats(&s);
  return s;
}

long ResidentKiB() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  if (fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = -1;
  fclose(f);
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// Each call leaves a per-thread buffer that glibc frees only after the key destructors.
void* LeaveLateFrees(void*) {
  const char* e = strerror(12345);
  const char* s = strsignal(SIGRTMIN + 1);
  void* lib = dlopen("libbrisk-test-no-such-library.so", RTLD_NOW);
  const char* d = dlerror();
  bool ok = e != nullptr && strstr(e, "12345") != nullptr && s != nullptr && lib == nullptr && d != nullptr;
  return ok ? nullptr : reinterpret_cast<void*>(1);
}

bool RunThreads(int count) {
  constexpr int kAtOnce = 8;
  for (int done = 0; done < count;) {
    pthread_t t[kAtOnce];
    int n = count - done < kAtOnce ? count - done : kAtOnce;
    for (int i = 0; i < n; ++i)
      if (pthread_create(&t[i], nullptr, LeaveLateFrees, nullptr) != 0) return false;
    bool ok = true;
    for (int i = 0; i < n; ++i) {
      void* r = nullptr;
      pthread_join(t[i], &r);
      ok &= r == nullptr;
    }
    if (!ok) return false;
    done += n;
  }
  return true;
}

}  // namespace

int main() {
  alarm(60);  // a hang is a failure, not a ctest timeout
  g_get_stats = reinterpret_cast<GetStatsFn>(dlsym(RTLD_DEFAULT, "brisk_get_stats"));
  if (g_get_stats == nullptr) {
    fprintf(stderr, "override_thread_exit: brisk_get_stats not found (is LD_PRELOAD set?)\n");
    return 1;
  }
  // Warm up: glibc's own one-time allocations (dlopen's state, locale) happen here.
  if (!RunThreads(100)) return 1;
  brisk_stats before = Stats();
  long rss_before = ResidentKiB();

  constexpr int kThreads = 4000;
  if (!RunThreads(kThreads)) {
    fprintf(stderr, "override_thread_exit: a thread failed to start or its calls failed\n");
    return 1;
  }
  brisk_stats after = Stats();
  long rss_after = ResidentKiB();
  long rss_growth = rss_after - rss_before;
  printf("override_thread_exit: %d threads: heaps_live %llu, heaps_total %llu -> %llu, chunks %llu -> %llu, "
         "RSS %ld -> %ld KiB\n",
         kThreads, static_cast<unsigned long long>(after.heaps_live),
         static_cast<unsigned long long>(before.heaps_total), static_cast<unsigned long long>(after.heaps_total),
         static_cast<unsigned long long>(before.chunks_mapped), static_cast<unsigned long long>(after.chunks_mapped),
         rss_before, rss_after);
  // Only the main thread holds a heap now; at most kAtOnce threads ran at a time, so the pool
  // never needed more heaps than that beyond the warm-up's.
  bool ok = true;
  if (after.heaps_live > 1) {
    fprintf(stderr, "override_thread_exit: %llu heaps still attached after every thread exited\n",
            static_cast<unsigned long long>(after.heaps_live));
    ok = false;
  }
  if (after.heaps_total - before.heaps_total > 16) {
    fprintf(stderr, "override_thread_exit: %llu heaps created for %d threads run 8 at a time\n",
            static_cast<unsigned long long>(after.heaps_total - before.heaps_total), kThreads);
    ok = false;
  }
  if (after.chunks_mapped > before.chunks_mapped + 4) {
    fprintf(stderr, "override_thread_exit: chunks grew from %llu to %llu\n",
            static_cast<unsigned long long>(before.chunks_mapped),
            static_cast<unsigned long long>(after.chunks_mapped));
    ok = false;
  }
  if (rss_growth > 8 * 1024) {
    fprintf(stderr, "override_thread_exit: RSS grew by %ld KiB\n", rss_growth);
    ok = false;
  }
  return ok ? 0 : 1;
}
