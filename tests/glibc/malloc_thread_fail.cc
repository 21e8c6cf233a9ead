// Port of glibc's malloc/tst-malloc-thread-fail: under an address-space limit, nine threads
// (eight with small stacks, and the main thread) each allocate until allocation fails, wait for
// one another, then free everything. For every allocation function (malloc, realloc, calloc,
// valloc, pvalloc; aligned_alloc, memalign, posix_memalign at alignment 128) and several sizes:
// every block honours its alignment, calloc's blocks read zero, and a failing posix_memalign
// returns ENOMEM and leaves ENOMEM in errno (glibc's test aborts on any other errno). Each case
// runs in a child process so the next starts from scratch. glibc's limit is 200 MB; this one is
// the process's address space at start plus 16 MB, so that the 19 cases take about 2 s under
// brisk and 6 s under glibc here (64 MB: 12 s and 23 s).
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "tests/glibc/port.h"

namespace {

enum Function { kMalloc, kRealloc, kAlignedAlloc, kMemalign, kPosixMemalign, kValloc, kPvalloc, kCalloc, kCount };
const char* const kNames[kCount] = {"malloc", "realloc", "aligned_alloc", "memalign",
                                    "posix_memalign", "valloc", "pvalloc", "calloc"};
bool AlignmentSensitive(int f) { return f == kAlignedAlloc || f == kMemalign || f == kPosixMemalign; }

size_t g_page;
size_t g_size;
size_t g_alignment;
int g_function;
constexpr int kThreads = 8;
pthread_barrier_t g_start, g_end;
pthread_attr_t g_small_stack;

[[noreturn]] void ChildFails(const char* what) {
  printf("tst-malloc-thread-fail: %s(size %zu, alignment %zu): %s\n", kNames[g_function], g_size, g_alignment, what);
  fflush(stdout);
  _exit(1);
}

__attribute__((noinline)) void* Zeroed(size_t n, size_t m) { return calloc(n, m); }

// One allocation with the function under test; nullptr once memory runs out.
void* Allocate() {
  void* p = nullptr;
  size_t alignment = alignof(max_align_t);
  switch (g_function) {
    case kMalloc:
      p = malloc(g_size);
      break;
    case kRealloc: {
      void* small = realloc(nullptr, 16);
      if (small != nullptr) {
        p = realloc(small, g_size);
        if (p == nullptr) free(small);
      }
      break;
    }
    case kAlignedAlloc:
      p = aligned_alloc(g_alignment, g_size);
      alignment = g_alignment;
      break;
    case kMemalign:
      p = memalign(g_alignment, g_size);
      alignment = g_alignment;
      break;
    case kPosixMemalign: {
      errno = 0;
      int rc = posix_memalign(&p, g_alignment, g_size);
      if (rc != 0) {
        if (rc != ENOMEM || errno != ENOMEM) ChildFails("failed with something other than ENOMEM in result and errno");
        p = nullptr;
      }
      alignment = g_alignment;
      break;
    }
    case kValloc:
      p = valloc(g_size);
      alignment = g_page;
      break;
    case kPvalloc:
      p = pvalloc(g_size);
      alignment = g_page;
      break;
    case kCalloc:
      p = Zeroed(1, g_size);
      if (p != nullptr)
        for (size_t i = 0; i < g_size; ++i)
          if (static_cast<const char*>(p)[i] != 0) ChildFails("a byte not zero");
      break;
  }
  if (!port::Aligned(p, alignment)) ChildFails("a block not aligned");
  return p;
}

struct Node {
  Node* next;
};

void* AllocateUntilFailure(void*) {
  pthread_barrier_wait(&g_start);
  Node* head = nullptr;
  while (auto* n = static_cast<Node*>(Allocate())) {
    n->next = head;
    head = n;
  }
  pthread_barrier_wait(&g_end);
  while (head != nullptr) {
    Node* next = head->next;
    free(head);
    head = next;
  }
  return nullptr;
}

void RunOne() {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    pthread_t threads[kThreads];
    for (auto& t : threads)
      if (pthread_create(&t, &g_small_stack, AllocateUntilFailure, nullptr) != 0) ChildFails("pthread_create failed");
    AllocateUntilFailure(nullptr);
    for (auto& t : threads) pthread_join(t, nullptr);
    _exit(0);
  }
  PORT_CHECK(pid > 0, "fork failed");
  int status = 0;
  PORT_CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
  PORT_CHECK(status == 0, "%s(size %zu, alignment %zu): child exit status %#x", kNames[g_function], g_size,
             g_alignment, status);
}

void RunAllFunctions() {
  for (int f = 0; f < kCount; ++f) {
    if (AlignmentSensitive(f) != (g_alignment != 0)) continue;
    g_function = f;
    RunOne();
  }
}

size_t AddressSpaceBytes() {
  unsigned long pages = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr || fscanf(f, "%lu", &pages) != 1) pages = 0;
  if (f != nullptr) fclose(f);
  return pages * g_page;
}

}  // namespace

int main() {
  port::Start("tst-malloc-thread-fail", 120);
  g_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  mallopt(M_ARENA_MAX, 2);  // as glibc's test; under brisk this sets glibc's unused malloc
  size_t start = AddressSpaceBytes();
  PORT_CHECK(start != 0, "cannot read /proc/self/statm");
  struct rlimit limit;
  getrlimit(RLIMIT_AS, &limit);
  rlim_t target = start + (size_t{16} << 20);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > target) {
    limit.rlim_cur = target;
    PORT_CHECK(setrlimit(RLIMIT_AS, &limit) == 0, "setrlimit(RLIMIT_AS) failed");
  }
  pthread_attr_init(&g_small_stack);
  pthread_attr_setstacksize(&g_small_stack, 256 * 1024);
  pthread_barrier_init(&g_start, nullptr, kThreads + 1);
  pthread_barrier_init(&g_end, nullptr, kThreads + 1);

  g_alignment = 0;
  for (size_t size : {size_t{144}, g_page}) {
    g_size = size;
    RunAllFunctions();
  }
  g_alignment = 128;
  for (size_t size : {size_t{512}, g_page, 17 * g_page}) {
    g_size = size;
    RunAllFunctions();
  }
  return port::Finish();
}
