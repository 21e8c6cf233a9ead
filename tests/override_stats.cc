// glibc's statistics calls under LD_PRELOAD=libbrisk.so answer for brisk: mallinfo2 and
// mallinfo count brisk's blocks, malloc_stats prints brisk's table to stderr, malloc_info writes
// XML. Prints one line per failed check and exits 1 if any failed.
//   override_stats            the checks
//   override_stats --idle     allocates a little and exits (for the BRISK_STATS=2 exit test)
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "check.h"

namespace {

using brisk_test::g_failures;

bool FromBrisk(const char* name) {
  void* sym = dlsym(RTLD_DEFAULT, name);
  Dl_info info{};
  return sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr &&
         strstr(info.dli_fname, "libbrisk.so") != nullptr;
}

// What fn writes to the descriptor `fd` while it runs.
template <class Fn>
std::string Captured(int fd, Fn fn) {
  FILE* tmp = tmpfile();
  if (tmp == nullptr) return "";
  fflush(nullptr);
  int saved = dup(fd);
  dup2(fileno(tmp), fd);
  fn();
  fflush(nullptr);
  dup2(saved, fd);
  close(saved);
  std::string text;
  rewind(tmp);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, tmp)) > 0;) text.append(buf, n);
  fclose(tmp);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--idle") == 0) {
    void* keep = malloc(1000);
    printf("%p\n", keep);
    return 0;
  }
  for (const char* name : {"mallinfo2", "mallinfo", "malloc_stats", "malloc_info"})
    CHECK(FromBrisk(name), "%s does not resolve into libbrisk.so", name);

  struct mallinfo2 before = mallinfo2();
  std::vector<void*> blocks;
  for (int i = 0; i < 1000; ++i) blocks.push_back(malloc(1024));
  struct mallinfo2 during = mallinfo2();
  CHECK(during.uordblks >= before.uordblks + 1000 * 1024, "uordblks grew from %zu to %zu: not by 1000 KiB",
        before.uordblks, during.uordblks);
  CHECK(during.arena >= during.uordblks, "arena %zu < uordblks %zu (no large blocks live)", during.arena,
        during.uordblks);
  void* large = malloc(5 << 20);
  struct mallinfo2 with_large = mallinfo2();
  CHECK(with_large.hblks == during.hblks + 1, "hblks %zu -> %zu after one large block", during.hblks,
        with_large.hblks);
  CHECK(with_large.hblkhd >= during.hblkhd + (5 << 20), "hblkhd %zu -> %zu", during.hblkhd, with_large.hblkhd);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
  CHECK(old.uordblks >= 1000 * 1024, "mallinfo().uordblks %d", old.uordblks);
  free(large);
  for (void* p : blocks) free(p);
  struct mallinfo2 after = mallinfo2();
  CHECK(after.uordblks + 1000 * 1024 <= during.uordblks, "uordblks %zu after the frees, %zu before",
        after.uordblks, during.uordblks);

  std::string printed = Captured(2, [] { malloc_stats(); });
  CHECK(printed.find("bytes_in_use") != std::string::npos, "malloc_stats printed: [%s]", printed.c_str());

  std::string xml = Captured(1, [] { CHECK(malloc_info(0, stdout) == 0, "malloc_info(0) failed"); });
  CHECK(xml.rfind("<malloc version=\"1\">", 0) == 0 && xml.find("</malloc>") != std::string::npos,
        "malloc_info wrote: [%s]", xml.c_str());
  errno = 0;
  CHECK(malloc_info(1, stdout) == -1 && errno == EINVAL, "malloc_info(1) did not fail with EINVAL");

  if (g_failures != 0) {
    fprintf(stderr, "override_stats: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("override_stats: ok\n");
  return 0;
}
