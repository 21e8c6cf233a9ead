/* A process ends when its last thread does: the main thread calls pthread_exit, and the
 * process must end (glibc's exit(0)) once the worker returns, with its atexit handlers run
 * under the program's signal mask.
 * brisk's background thread (threadcache/background.cc) must not keep it alive: before it
 * ended on its own, the child below never exited.
 *
 * Run without arguments it is the driver: it runs itself as the child (same environment, so
 * LD_PRELOAD=libbrisk.so and BRISK_BACKGROUND=1 from ctest), waits for it up to kLimitSeconds,
 * and checks its exit status and output. Exit status 0: passed. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kLimitSeconds = 30 };

static void say(const char* text) {
  ssize_t ignored = write(1, text, strlen(text));
  (void)ignored;
}

/* The state letter of /proc/self/task/<tid>/stat, or 0. */
static char task_state(const char* tid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/self/task/%s/stat", tid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char* paren = strrchr(text, ')');
  return paren != NULL && paren[1] == ' ' ? paren[2] : 0;
}

/* Walks the threads of the process whose directory is proc_dir ("/proc/self", "/proc/<pid>"):
 * prints each one's id and name to stderr if print, and returns whether one is named brisk-bg. */
static int walk_threads(const char* proc_dir, int print) {
  char task_dir[64];
  snprintf(task_dir, sizeof task_dir, "%s/task", proc_dir);
  DIR* d = opendir(task_dir);
  if (d == NULL) return 0;
  int found = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[384], name[32] = "?";
    snprintf(path, sizeof path, "%s/%s/comm", task_dir, e->d_name);
    FILE* f = fopen(path, "r");
    if (f != NULL) {
      if (fgets(name, sizeof name, f) == NULL) strcpy(name, "?");
      fclose(f);
    }
    name[strcspn(name, "\n")] = '\0';
    if (strcmp(name, "brisk-bg") == 0) found = 1;
    if (print) fprintf(stderr, "  thread %s: %s\n", e->d_name, name);
  }
  closedir(d);
  return found;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The handler runs on whichever thread ends the process; with brisk that is its background
 * thread, which must by then have the program's signal mask back (SIGTERM not blocked). */
static void at_exit(void) {
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, NULL, &mask);
  say(sigismember(&mask, SIGTERM) ? "atexit ran, SIGTERM blocked\n" : "atexit ran\n");
}

/* Set by the worker once it has allocated: both threads then have a heap, which starts the
 * background thread; the main thread exits only after that. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_allocated_cond = PTHREAD_COND_INITIALIZER;
static int g_allocated = 0;

static void* worker(void* arg) {
  (void)arg;
  void* blocks[256];
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 256; ++i) {
      blocks[i] = malloc(16 + (size_t)i * 8);
      memset(blocks[i], 0x5A, 16 + (size_t)i * 8);
    }
    for (int i = 0; i < 256; ++i) free(blocks[i]);
  }
  pthread_mutex_lock(&g_lock);
  g_allocated = 1;
  pthread_cond_signal(&g_allocated_cond);
  pthread_mutex_unlock(&g_lock);
  /* The case under test: the main thread gone (a zombie until the process ends), the
   * background thread running, this the program's last thread. */
  char main_tid[32];
  snprintf(main_tid, sizeof main_tid, "%d", (int)getpid());
  int seen = 0;
  for (int tries = 0; tries < 500; ++tries) {
    seen = walk_threads("/proc/self", 0);
    if (seen && task_state(main_tid) == 'Z') break;
    sleep_ms(10);
  }
  say(seen ? "background thread seen\n" : "no background thread\n");
  say(task_state(main_tid) == 'Z' ? "main thread exited\n" : "main thread still running\n");
  return NULL;
}

static int child(void) {
  atexit(at_exit);
  void* p = malloc(100);
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) != 0) {
    say("pthread_create failed\n");
    return 1;
  }
  pthread_mutex_lock(&g_lock);
  while (!g_allocated) pthread_cond_wait(&g_allocated_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  free(p);
  pthread_exit(NULL);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) return child();
  int out[2];
  if (pipe(out) != 0) return 2;
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl("/proc/self/exe", argv[0], "child", (char*)NULL);
    _exit(127);
  }
  close(out[1]);
  int status = 0;
  pid_t done = 0;
  for (long waited_ms = 0; waited_ms < kLimitSeconds * 1000L; waited_ms += 10) {
    done = waitpid(pid, &status, WNOHANG);
    if (done != 0) break;
    sleep_ms(10);
  }
  if (done == 0) {
    fprintf(stderr, "FAIL: the child is still running %d s after its main thread called pthread_exit "
            "(its last thread should have ended it); its threads:\n", kLimitSeconds);
    char proc_dir[32];
    snprintf(proc_dir, sizeof proc_dir, "/proc/%d", (int)pid);
    walk_threads(proc_dir, 1);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return 1;
  }
  char text[512];
  size_t n = 0;
  ssize_t got;
  while (n < sizeof text - 1 && (got = read(out[0], text + n, sizeof text - 1 - n)) > 0) n += (size_t)got;
  text[n] = '\0';
  printf("child output:\n%s", text);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL: the child ended with status %#x, not exit(0)\n", status);
    return 1;
  }
  if (strstr(text, "background thread seen\n") == NULL || strstr(text, "main thread exited\n") == NULL) {
    fprintf(stderr, "FAIL: the case was not set up (no background thread, or the main thread still running)\n");
    return 1;
  }
  if (strstr(text, "atexit ran\n") == NULL) {
    fprintf(stderr, "FAIL: the child's atexit handler did not run, or ran with SIGTERM blocked\n");
    return 1;
  }
  printf("the child ended with exit(0) after its last thread, atexit handler run\n");
  return 0;
}
