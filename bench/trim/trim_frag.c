/* brisk-trim-frag: what malloc_trim(0) gives back when live blocks are scattered among free ones,
 * and what calling it often costs. Plain C with no brisk header: run it under any allocator
 * (LD_PRELOAD=...); the numbers are the process's resident set (/proc/self/statm).
 *
 *   brisk-trim-frag scatter [SIZE] [COUNT]   COUNT blocks of SIZE bytes (1,000,000 of 64), each
 *       written; 99% freed at random (one in 100 kept, a fixed generator); then malloc_trim(0).
 *       Prints RSS at the peak, after the frees and after the call, and the call's time; then
 *       allocates the freed blocks again, writes them, and checks every block's contents.
 *   brisk-trim-frag periodic [ROUNDS]         ROUNDS (200) rounds of 20,000 mixed mallocs of
 *       16-1,015 bytes, one in ten kept in a cache of 20,000 (evicting at random), the rest freed,
 *       and malloc_trim(0) after each round. Prints the total time, the time in malloc_trim and
 *       the largest and final RSS.
 *   brisk-trim-frag beside [COUNT]            a thread allocates COUNT (1,000,000) blocks of 1 KiB,
 *       keeps one in 100 and exits; then main calls malloc_trim(0) while another thread keeps
 *       allocating 1 KiB blocks. Prints the trim's time and that thread's longest malloc during
 *       it: how long a trim holds other threads up.
 *   brisk-trim-frag exit-idle                 four threads each allocate 524,288 blocks of
 *       16-256 bytes, keep one in 100 for main, free the rest and exit; main then idles, calling
 *       no allocator function. Prints RSS right after the exits and 1, 5 and 10 s later: what
 *       the allocator gives back on its own.
 *
 * Exit status 1 if a block's contents were damaged. Build with -fno-builtin: the compiler may
 * otherwise drop a malloc/free pair whose block it sees unused. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == NULL) return 0;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  fclose(f);
  return resident * 4;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned next_random(unsigned* s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 16;
}

static int scatter(size_t size, size_t count) {
  unsigned char** v = malloc(count * sizeof *v);
  if (v == NULL) return 2;
  for (size_t i = 0; i < count; ++i) {
    v[i] = malloc(size);
    if (v[i] == NULL) return 2;
    memset(v[i], (int)(i & 0xff), size);
  }
  long peak = rss_kib();
  unsigned s = 1;
  size_t kept = 0, bad = 0;
  for (size_t i = 0; i < count; ++i) {
    if (next_random(&s) % 100 == 0) {
      ++kept;
      continue;
    }
    free(v[i]);
    v[i] = NULL;
  }
  long freed = rss_kib();
  double t0 = now();
  malloc_trim(0);
  double t1 = now();
  long trimmed = rss_kib();
  for (size_t i = 0; i < count; ++i) {
    if (v[i] != NULL) continue;
    v[i] = malloc(size);
    if (v[i] == NULL) return 2;
    memset(v[i], (int)(i & 0xff), size);
  }
  long refilled = rss_kib();
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < size; ++k)
      if (v[i][k] != (unsigned char)(i & 0xff)) {
        ++bad;
        break;
      }
    free(v[i]);
  }
  free(v);
  printf("scatter %zu x %zu B, %zu kept: RSS KiB peak %ld, after the frees %ld, after malloc_trim %ld (%.1f ms), "
         "after allocating the freed again %ld; damaged blocks %zu\n",
         count, size, kept, peak, freed, trimmed, (t1 - t0) * 1e3, refilled, bad);
  return bad != 0;
}

enum { kCache = 20000, kRequest = 20000 };

static int periodic(int rounds) {
  static void* cache[kCache];
  static void* request[kRequest];
  unsigned s = 12345;
  long max_rss = 0;
  double t0 = now(), in_trim = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < kRequest; ++i) {
      size_t size = 16 + next_random(&s) % 1000;
      request[i] = malloc(size);
      if (request[i] == NULL) return 2;
      memset(request[i], r, size < 64 ? size : 64);
      if (next_random(&s) % 10 == 0) {
        unsigned k = next_random(&s) % kCache;
        free(cache[k]);
        cache[k] = request[i];
        request[i] = NULL;
      }
    }
    for (int i = 0; i < kRequest; ++i) free(request[i]);
    double a = now();
    malloc_trim(0);
    in_trim += now() - a;
    long rss = rss_kib();
    if (rss > max_rss) max_rss = rss;
  }
  printf("periodic %d rounds: %.3f s, %.3f s of it in malloc_trim; RSS KiB largest %ld, final %ld\n", rounds,
         now() - t0, in_trim, max_rss, rss_kib());
  for (int k = 0; k < kCache; ++k) free(cache[k]);
  return 0;
}

struct Beside {
  size_t count;
  void** blocks;
  volatile int go, stop;
  double longest;
};

static void* leave_blocks(void* arg) {
  struct Beside* b = arg;
  for (size_t i = 0; i < b->count; ++i) {
    b->blocks[i] = malloc(1024);
    if (b->blocks[i] == NULL) abort();
    memset(b->blocks[i], 1, 1024);
  }
  for (size_t i = 0; i < b->count; ++i)
    if (i % 100 != 0) {
      free(b->blocks[i]);
      b->blocks[i] = NULL;
    }
  return NULL;
}

static void* allocate_beside(void* arg) {
  struct Beside* b = arg;
  size_t cap = 4 * b->count, n = 0;
  void** mine = malloc(cap * sizeof *mine);
  if (mine == NULL) abort();
  while (!b->go) {
  }
  while (!b->stop && n < cap) {
    double t0 = now();
    mine[n] = malloc(1024);
    double took = now() - t0;
    if (mine[n] == NULL) abort();
    memset(mine[n], 2, 64);
    if (took > b->longest) b->longest = took;
    ++n;
  }
  for (size_t i = 0; i < n; ++i) free(mine[i]);
  free(mine);
  return NULL;
}

static int beside(size_t count) {
  struct Beside b = {count, malloc(count * sizeof(void*)), 0, 0, 0};
  pthread_t leaver, allocator;
  if (b.blocks == NULL) return 2;
  pthread_create(&leaver, NULL, leave_blocks, &b);
  pthread_join(leaver, NULL);
  pthread_create(&allocator, NULL, allocate_beside, &b);
  b.go = 1;
  struct timespec settle = {0, 20 * 1000 * 1000};
  nanosleep(&settle, NULL);
  double t0 = now();
  malloc_trim(0);
  double t1 = now();
  b.stop = 1;
  pthread_join(allocator, NULL);
  for (size_t i = 0; i < count; ++i) free(b.blocks[i]);
  free(b.blocks);
  printf("beside: malloc_trim %.1f ms; the other thread's longest malloc meanwhile %.3f ms\n", (t1 - t0) * 1e3,
         b.longest * 1e3);
  return 0;
}

enum { kExitThreads = 4, kExitBlocks = 1 << 19 };
static void* g_exit_kept[kExitThreads][kExitBlocks / 50];

static void* exit_worker(void* arg) {
  int t = (int)(intptr_t)arg;
  unsigned s = 77u + (unsigned)t;
  int kept = 0;
  void** v = malloc(kExitBlocks * sizeof *v);
  if (v == NULL) abort();
  for (int i = 0; i < kExitBlocks; ++i) {
    size_t size = 16 + next_random(&s) % 241;
    v[i] = malloc(size);
    if (v[i] == NULL) abort();
    memset(v[i], 1, size);
  }
  for (int i = 0; i < kExitBlocks; ++i) {
    if (next_random(&s) % 100 == 0 && kept < kExitBlocks / 50)
      g_exit_kept[t][kept++] = v[i];
    else
      free(v[i]);
  }
  free(v);
  return NULL;
}

static int exit_idle(void) {
  pthread_t threads[kExitThreads];
  for (int t = 0; t < kExitThreads; ++t) pthread_create(&threads[t], NULL, exit_worker, (void*)(intptr_t)t);
  for (int t = 0; t < kExitThreads; ++t) pthread_join(threads[t], NULL);
  long at[4];
  const unsigned waits[4] = {0, 1, 4, 5};
  for (int i = 0; i < 4; ++i) {
    if (waits[i] != 0) sleep(waits[i]);
    at[i] = rss_kib();
  }
  printf("exit-idle: RSS KiB after the threads exit %ld, 1 s %ld, 5 s %ld, 10 s %ld\n", at[0], at[1], at[2], at[3]);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "scatter") == 0)
    return scatter(argc > 2 ? (size_t)atol(argv[2]) : 64, argc > 3 ? (size_t)atol(argv[3]) : 1000000);
  if (argc >= 2 && strcmp(argv[1], "periodic") == 0) return periodic(argc > 2 ? atoi(argv[2]) : 200);
  if (argc >= 2 && strcmp(argv[1], "beside") == 0) return beside(argc > 2 ? (size_t)atol(argv[2]) : 1000000);
  if (argc >= 2 && strcmp(argv[1], "exit-idle") == 0) return exit_idle();
  fprintf(stderr, "usage: %s scatter [SIZE] [COUNT] | periodic [ROUNDS] | beside [COUNT] | exit-idle\n", argv[0]);
  return 2;
}
