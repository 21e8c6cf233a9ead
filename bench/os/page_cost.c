/* brisk-page-cost [MIB] [ROUNDS]: what it costs here to make a fresh anonymous page present,
 * per 4 KiB page, the best of ROUNDS (default 5) passes over MIB (default 64) MiB of a fresh
 * private mapping (transparent huge pages off for it), one page at a time:
 *   fault     the first write faults the page in;
 *   populate  madvise(MADV_POPULATE_WRITE) of the page (Linux 5.14), then the write;
 * each with nothing else running, with a second thread of the process spinning on the other
 * CPU, and with a second thread that maps, writes and unmaps 1 MiB in a loop (it takes the
 * process's mmap_lock for writing, which MADV_POPULATE_WRITE takes for reading; since Linux 6.4
 * a fault takes only its mapping's lock). brisk's carve populates the fresh page it writes first
 * (BRISK_POPULATE, README "Memory layout"): this is the comparison behind that lever, to be
 * made on each machine. Prints one line per case, microseconds per page. Exit status: 0; 1 if a
 * mapping fails; 2 on wrong usage. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { kPage = 4096 };
enum Other { kAlone, kSpinner, kMapper };

static atomic_int g_stop;

static void* spin(void* arg) {
  (void)arg;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
  }
  return NULL;
}

static void* map_unmap(void* arg) {
  (void)arg;
  const size_t size = (size_t)1 << 20;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    char* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) continue;
    p[0] = 1;
    munmap(p, size);
  }
  return NULL;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Microseconds per page, the best of `rounds`; a negative value: populate refused (errno kept). */
static double measure(int populate, enum Other other, size_t bytes, int rounds) {
  pthread_t t;
  int started = 0;
  atomic_store(&g_stop, 0);
  if (other != kAlone) started = pthread_create(&t, NULL, other == kSpinner ? spin : map_unmap, NULL) == 0;
  const size_t pages = bytes / kPage;
  double best = -1;
  for (int r = 0; r < rounds; ++r) {
    char* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      best = -2;
      break;
    }
    madvise(p, bytes, MADV_NOHUGEPAGE);
    const double t0 = now_us();
    int refused = 0;
    for (size_t i = 0; i < pages && !refused; ++i) {
      if (populate && madvise(p + i * kPage, kPage, MADV_POPULATE_WRITE) != 0) refused = 1;
      p[i * kPage] = 1;
    }
    const double per_page = (now_us() - t0) / (double)pages;
    munmap(p, bytes);
    if (refused) {
      best = -1;
      break;
    }
    if (best < 0 || per_page < best) best = per_page;
  }
  atomic_store(&g_stop, 1);
  if (started) pthread_join(t, NULL);
  return best;
}

int main(int argc, char** argv) {
  long mib = 64, rounds = 5;
  char* end = NULL;
  if (argc > 3) goto usage;
  if (argc > 1 && ((mib = strtol(argv[1], &end, 10)) <= 0 || *end != '\0' || mib > 4096)) goto usage;
  if (argc > 2 && ((rounds = strtol(argv[2], &end, 10)) <= 0 || *end != '\0' || rounds > 1000)) goto usage;
  static const char* const kOther[] = {"alone", "with a spinning thread", "with a thread mapping and unmapping"};
  for (int other = kAlone; other <= kMapper; ++other) {
    for (int populate = 0; populate <= 1; ++populate) {
      const double us = measure(populate, (enum Other)other, (size_t)mib << 20, (int)rounds);
      if (us == -2) {
        fprintf(stderr, "brisk-page-cost: mmap of %ld MiB failed: %s\n", mib, strerror(errno));
        return 1;
      }
      if (us < 0) {
        printf("%-8s %-36s refused by this kernel\n", "populate", kOther[other]);
        continue;
      }
      printf("%-8s %-36s %7.3f us/page\n", populate ? "populate" : "fault", kOther[other], us);
    }
  }
  return 0;
usage:
  fprintf(stderr, "usage: brisk-page-cost [MIB] [ROUNDS]\n");
  return 2;
}
