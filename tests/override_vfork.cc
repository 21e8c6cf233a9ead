// A vfork child that allocates, under LD_PRELOAD=libbrisk.so: it shares its parent's memory, so
// its allocation is brisk's (the calling thread's first, here, and the process's second heap,
// which starts the background thread). The background thread must not be started in the child
// (it would die with it, perhaps holding the parent's locks, and leave the parent marked as
// having one): after the child is gone, the parent's next thread starts it in the parent. Exits
// 1 when no brisk-bg thread appears within 5 s. (Allocating in a vfork child is outside POSIX;
// programs do it.)
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

// Whether a thread of this process is named brisk-bg (/proc/self/task/*/comm).
bool BackgroundThreadRuns() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[64] = {};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (f == nullptr) continue;
    if (fgets(name, sizeof name, f) != nullptr && strncmp(name, "brisk-bg", 8) == 0) found = true;
    fclose(f);
  }
  closedir(d);
  return found;
}

void* VforkAndAllocateInTheChild(void*) {
  pid_t pid = vfork();
  if (pid == 0) {
    void* volatile p = malloc(100);  // this thread's first block: a heap, the process's second
    static_cast<char*>(p)[0] = 1;
    _exit(0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
    fprintf(stderr, "override_vfork: the vfork child failed\n");
    exit(2);
  }
  return nullptr;
}

void* Allocate(void*) {
  void* volatile p = malloc(100);
  free(p);
  return nullptr;
}

}  // namespace

int main() {
  void* volatile first = malloc(100);  // the main thread's heap: one live
  free(first);
  if (BackgroundThreadRuns()) {
    fprintf(stderr, "override_vfork: brisk-bg runs before a second thread allocated\n");
    return 2;
  }
  pthread_t t;
  pthread_create(&t, nullptr, VforkAndAllocateInTheChild, nullptr);
  pthread_join(t, nullptr);
  pthread_create(&t, nullptr, Allocate, nullptr);  // a second heap in the parent
  pthread_join(t, nullptr);
  for (int i = 0; i < 500; ++i) {
    if (BackgroundThreadRuns()) return 0;
    usleep(10000);
  }
  fprintf(stderr, "override_vfork: no brisk-bg thread in the parent\n");
  return 1;
}
