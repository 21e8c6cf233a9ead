// Bad frees must be caught, even in the release build: brisk writes one line to stderr that
// starts with "brisk: " and names the pointer (printed with %p), then aborts.
//
// Each death statement first prints "victim=<pointer>" to stderr and then frees that pointer.
// The matcher below requires a "brisk: " line that contains exactly that pointer string. This
// works with the "threadsafe" death-test style, where the child re-executes the test and ASLR
// gives it addresses different from the parent's.
#include <brisk/brisk.h>

#include <errno.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "core/chunk.h"
#include "core/config.h"
#include "tests/test_util.h"

extern "C" void* __libc_malloc(size_t size);  // glibc's own malloc, whatever malloc resolves to

namespace {

// Prints the pointer that is about to be freed, so the matcher knows what to look for.
void Announce(const void* p) { std::fprintf(stderr, "victim=%p\n", p); }

class NamesVictimMatcher : public testing::MatcherInterface<const std::string&> {
 public:
  // what: if not empty, the report line must also start with "brisk: <what> ".
  explicit NamesVictimMatcher(std::string what = "") : what_(std::move(what)) {}
  bool MatchAndExplain(const std::string& err, testing::MatchResultListener* listener) const override {
    if (!what_.empty() && err.find("brisk: " + what_ + " ") == std::string::npos) {
      *listener << "no report \"brisk: " << what_ << " ...\"";
      return false;
    }
    size_t at = err.find("victim=");
    if (at == std::string::npos) {
      *listener << "the death statement never announced its pointer";
      return false;
    }
    size_t end = err.find('\n', at);
    std::string victim = err.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
    std::istringstream lines(err);
    std::string line;
    int brisk_lines = 0;
    bool named = false;
    while (std::getline(lines, line)) {
      if (line.rfind("brisk: ", 0) != 0) continue;
      ++brisk_lines;
      // The pointer must appear as a whole token (not as a prefix of a longer hex number).
      for (size_t pos = line.find(victim); pos != std::string::npos; pos = line.find(victim, pos + 1)) {
        char next = pos + victim.size() < line.size() ? line[pos + victim.size()] : ' ';
        if (!std::isxdigit(static_cast<unsigned char>(next))) named = true;
      }
    }
    if (!named) {
      *listener << "no line starting with \"brisk: \" names " << victim;
      return false;
    }
    if (brisk_lines != 1) {
      *listener << "expected exactly one \"brisk: \" line, got " << brisk_lines;
      return false;
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "has one line starting with \"brisk: " << what_ << "\" that names the announced pointer";
  }

 private:
  std::string what_;
};

testing::Matcher<const std::string&> NamesVictim(std::string what = "") {
  return testing::MakeMatcher(new NamesVictimMatcher(std::move(what)));
}

#define EXPECT_BRISK_ABORT(statement) EXPECT_EXIT(statement, testing::KilledBySignal(SIGABRT), NamesVictim())
#define EXPECT_BRISK_ABORT_SAYING(statement, what) \
  EXPECT_EXIT(statement, testing::KilledBySignal(SIGABRT), NamesVictim(what))

class BadFree : public testing::Test {
 protected:
  static void SetUpTestSuite() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

void DoubleFree(size_t size) {
  void* p = brisk_malloc(size);
  std::memset(p, 1, size);
  brisk_free(p);
  Announce(p);
  brisk_free(p);
}

TEST_F(BadFree, DoubleFreeSmall) {
  EXPECT_BRISK_ABORT(DoubleFree(48));
  EXPECT_BRISK_ABORT(DoubleFree(16));
  EXPECT_BRISK_ABORT(DoubleFree(1));
}

TEST_F(BadFree, DoubleFreeSmallAfterOtherFrees) {
  // free(a); free(b); free(a): a is no longer at the head of any free list.
  auto body = [] {
    void* a = brisk_malloc(32);
    void* b = brisk_malloc(32);
    void* c = brisk_malloc(32);
    brisk_free(a);
    brisk_free(b);
    brisk_free(c);
    Announce(a);
    brisk_free(a);
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, DoubleFreeSmallFromAnotherThread) {
  // The block is freed remotely (by a thread that did not allocate it), then freed again.
  auto body = [] {
    void* p = brisk_malloc(64);
    std::thread([p] { brisk_free(p); }).join();
    Announce(p);
    brisk_free(p);
  };
  EXPECT_BRISK_ABORT(body());
}

// A block start in the uncarved part of a span whose thread exited: the freeing thread adopts
// the span, and must still refuse the block (accepting it dropped the span's count to zero and
// released it under the live block of the exited thread).
TEST_F(BadFree, NeverHandedOutBlockOfAnExitedThreadsSpan) {
  auto body = [] {
    char* first = nullptr;
    std::thread([&] { first = static_cast<char*>(brisk_malloc(64)); }).join();
    // Spans carve one OS page at a time: 8 KiB past a fresh span's first block is a block start
    // that was never carved.
    char* uncarved = first + 8192;
    Announce(uncarved);
    brisk_free(uncarved);
    std::fprintf(stderr, "accepted\n");
    std::exit(0);
  };
  EXPECT_BRISK_ABORT_SAYING(body(), "invalid free of");
}

// A free racing with the release of its span (a double or invalid free while the span's owner
// gives it back): checked_block sees the span in use, and its owner is null by the time
// free_slow reads it. The window is made by hand: the owner cleared under a live block.
TEST_F(BadFree, AFreeIntoASpanBeingGivenBackIsReported) {
  auto body = [] {
    void* p = brisk_malloc(64);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    brisk::chunk_of(a)->span_of(a)->owner.store(nullptr, std::memory_order_release);
    Announce(p);
    brisk_free(p);
    std::fprintf(stderr, "accepted\n");
    std::exit(0);
  };
  EXPECT_BRISK_ABORT_SAYING(body(), "invalid free of");
}

TEST_F(BadFree, DoubleFreeMedium) {
  EXPECT_BRISK_ABORT(DoubleFree(3000));
  EXPECT_BRISK_ABORT(DoubleFree(40000));
}

TEST_F(BadFree, DoubleFreeLarge) {
  EXPECT_BRISK_ABORT(DoubleFree(size_t{8} << 20));
}

TEST_F(BadFree, DoubleFreeSized) {
  auto body = [] {
    void* p = brisk_malloc(48);
    brisk_free_sized(p, 48);
    Announce(p);
    brisk_free_sized(p, 48);
  };
  EXPECT_BRISK_ABORT(body());
}

void FreeInterior(size_t size, size_t offset) {
  char* p = static_cast<char*>(brisk_malloc(size));
  std::memset(p, 1, size);
  Announce(p + offset);
  brisk_free(p + offset);
}

TEST_F(BadFree, InteriorPointerSmall) {
  EXPECT_BRISK_ABORT(FreeInterior(48, 16));
  EXPECT_BRISK_ABORT(FreeInterior(48, 8));
  EXPECT_BRISK_ABORT(FreeInterior(48, 1));
  EXPECT_BRISK_ABORT(FreeInterior(256, 128));
}

TEST_F(BadFree, InteriorPointerMedium) { EXPECT_BRISK_ABORT(FreeInterior(20000, 4096)); }

TEST_F(BadFree, InteriorPointerLarge) {
  // A page-aligned pointer into a large block.
  EXPECT_BRISK_ABORT(FreeInterior(size_t{4} << 20, size_t{1} << 20));
}

// A large block's region is 4 MiB; its mapping may end well before the region does. A pointer
// in that gap lies in a region the map calls "large", but the page below it, where a header
// would be, need not be mapped: brisk must refuse it without reading there.
constexpr size_t kLargeSize = size_t{3} << 20;

bool Mapped(const char* page) {
  unsigned char v;
  return mincore(const_cast<char*>(page), 4096, &v) == 0 || errno != ENOMEM;
}

// A page-aligned pointer in the region of p (a large block of kLargeSize) past its mapping,
// whose page below is not mapped: p + 3 MiB + 256 KiB unless another mapping has taken the
// space there since (the kernel reuses the trimmed tail of brisk's aligned mapping).
char* PastLargeMapping(char* p) {
  const size_t kChunk = size_t{4} << 20;
  char* region_end = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + kChunk) & ~(kChunk - 1));
  for (char* q = p + kLargeSize + (size_t{256} << 10); q < region_end; q += 4096) {
    if (!Mapped(q - 4096)) return q;
  }
  for (char* q = p + kLargeSize + 4096; q < region_end; q += 4096) {
    if (!Mapped(q - 4096)) return q;
  }
  std::fprintf(stderr, "no unmapped page past the block in its region\n");
  std::abort();
}

TEST_F(BadFree, PointerPastALargeMappingInItsRegion) {
  auto body = [] {
    auto* p = static_cast<char*>(brisk_malloc(kLargeSize));
    std::memset(p, 1, kLargeSize);
    char* q = PastLargeMapping(p);
    Announce(q);
    brisk_free(q);
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, ReallocOfAPointerPastALargeMapping) {
  auto body = [] {
    char* q = PastLargeMapping(static_cast<char*>(brisk_malloc(kLargeSize)));
    Announce(q);
    brisk_realloc(q, 100);
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, UsableSizeOfAPointerPastALargeMapping) {
  auto body = [] {
    char* q = PastLargeMapping(static_cast<char*>(brisk_malloc(kLargeSize)));
    Announce(q);
    std::fprintf(stderr, "%zu\n", brisk_usable_size(q));
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, StackAddress) {
  auto body = [] {
    alignas(64) volatile char on_stack[256];
    on_stack[0] = 1;
    Announce(const_cast<char*>(on_stack));
    brisk_free(const_cast<char*>(on_stack));
  };
  EXPECT_BRISK_ABORT(body());
}

alignas(64) char g_global_buffer[4096];

TEST_F(BadFree, GlobalAddress) {
  auto body = [] {
    Announce(g_global_buffer);
    brisk_free(g_global_buffer);
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, GlibcMallocPointer) {
  auto body = [] {
    void* p = __libc_malloc(48);
    std::memset(p, 1, 48);
    Announce(p);
    brisk_free(p);
  };
  EXPECT_BRISK_ABORT(body());
}

TEST_F(BadFree, ForeignMapping) {
  // A page brisk never handed out, mapped directly, both at its start and at a 4 MiB-aligned
  // address (where a chunk header would be if it were a brisk chunk).
  auto body = [](bool chunk_aligned) {
    size_t len = size_t{16} << 20;
    char* m = static_cast<char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED) std::abort();
    char* p = m + 4096;
    if (chunk_aligned) {
      uintptr_t a = (reinterpret_cast<uintptr_t>(m) + (size_t{4} << 20) - 1) & ~((uintptr_t{4} << 20) - 1);
      p = reinterpret_cast<char*>(a) + 64;
    }
    std::memset(m, 0, len);
    Announce(p);
    brisk_free(p);
  };
  EXPECT_BRISK_ABORT(body(false));
  EXPECT_BRISK_ABORT(body(true));
}

TEST_F(BadFree, UnalignedJunkPointer) {
  auto body = [] {
    void* p = reinterpret_cast<void*>(uintptr_t{0x1234567});
    Announce(p);
    brisk_free(p);
  };
  EXPECT_BRISK_ABORT(body());
}

// realloc checks the pointer before the size: a foreign or freed pointer is reported whatever
// size comes with it (a size it cannot serve, or 0, which would free).

void ReallocOf(void* p, size_t size) {
  Announce(p);
  void* q = brisk_realloc(p, size);
  fprintf(stderr, "realloc returned %p\n", q);
}

TEST_F(BadFree, ReallocOfAForeignPointerIsReportedWhateverTheSize) {
  for (size_t size : {size_t{64}, size_t{0}, SIZE_MAX}) {
    EXPECT_BRISK_ABORT_SAYING(ReallocOf(g_global_buffer, size), "invalid pointer");
  }
}

TEST_F(BadFree, ReallocOrUsableSizeOfAFreedBlockIsUseOfAFreedBlock) {
  auto realloc_freed = [](size_t size) {
    void* p = brisk_malloc(48);
    void* keep = brisk_malloc(48);  // p is not the span's only block
    brisk_free(p);
    ReallocOf(p, size);
    brisk_free(keep);
  };
  for (size_t size : {size_t{64}, size_t{0}, SIZE_MAX}) {
    EXPECT_BRISK_ABORT_SAYING(realloc_freed(size), "use of freed block");
  }
  auto usable_freed = [] {
    void* p = brisk_malloc(48);
    void* keep = brisk_malloc(48);
    brisk_free(p);
    Announce(p);
    fprintf(stderr, "usable %zu\n", brisk_usable_size(p));
    brisk_free(keep);
  };
  EXPECT_BRISK_ABORT_SAYING(usable_freed(), "use of freed block");
}

TEST_F(BadFree, UsableAfterValidFrees) {
  // Control: valid frees of the same shapes do not abort, so the death tests above are not
  // passing merely because the process dies for any free.
  EXPECT_EXIT(
      {
        for (size_t s : {size_t{1}, size_t{16}, size_t{48}, size_t{3000}, size_t{40000}, size_t{8} << 20}) {
          void* p = brisk_malloc(s);
          std::memset(p, 1, s);
          brisk_free(p);
        }
        void* q = brisk_malloc(64);
        std::thread([q] { brisk_free(q); }).join();
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

// The tcache-poisoning attack that glibc 2.32's safe-linking closed: a one-word linear overflow
// from a live block into the freed block just after it overwrites that block's free-list link
// with a chosen address. Unencoded links made the second malloc that followed return it.
alignas(64) unsigned char g_chosen_target[256];

TEST_F(BadFree, OneWordOverflowIntoAFreedBlockNeverYieldsTheChosenAddress) {
  if (!brisk::kEncodeFreeLinks) GTEST_SKIP() << "built with kEncodeFreeLinks = false";
  auto body = [] {
    constexpr int kBlocks = 256;
    char* v[kBlocks];
    for (auto& b : v) b = static_cast<char*>(brisk_malloc(64));
    // Two adjacent 64-byte blocks from the current span (the last ones handed out).
    int k = kBlocks - 2;
    while (k >= 0 && v[k + 1] != v[k] + 64) --k;
    if (k < 0) {
      std::fprintf(stderr, "no two adjacent blocks\n");
      std::exit(0);
    }
    char* live = v[k];
    char* freed = v[k + 1];
    brisk_free(freed);
    Announce(freed);
    auto chosen = reinterpret_cast<uintptr_t>(g_chosen_target);
    std::memcpy(live + 64, &chosen, sizeof chosen);  // the overflow: word 0 of the freed block
    void* first = brisk_malloc(64);
    void* second = brisk_malloc(64);
    std::fprintf(stderr, "first=%p (freed %p) second=%p (chosen %p)\n", first, static_cast<void*>(freed), second,
                 static_cast<void*>(g_chosen_target));
    std::exit(0);  // not caught: fails the death test, and the line above says what came back
  };
  EXPECT_BRISK_ABORT(body());
}

// The same write into a block on its way back to its owner (a remote-free chain): the owner's
// next refill drains the chain and must not follow the forged link.
TEST_F(BadFree, AWriteIntoARemotelyFreedBlockIsCaughtWhenItsChainIsDrained) {
  if (!brisk::kEncodeFreeLinks) GTEST_SKIP() << "built with kEncodeFreeLinks = false";
  auto body = [] {
    void* p = brisk_malloc(64);
    void* q = brisk_malloc(64);
    // The thread's exit sends its outgoing batch (p, then q) to this thread's queue.
    std::thread([p, q] {
      brisk_free(q);
      brisk_free(p);
    }).join();
    Announce(p);
    auto chosen = reinterpret_cast<uintptr_t>(g_chosen_target);
    std::memcpy(p, &chosen, sizeof chosen);  // a use after free of p: its link word
    brisk_malloc(20000);  // a class this thread never used: refills, draining the queue
    std::exit(0);
  };
  EXPECT_BRISK_ABORT(body());
}

// Two threads freeing the same foreign block at the same instant: exactly one free may pass.
// Each round runs in its own child (the correct outcome aborts it): the child's main thread
// allocates the block, two new threads meet at a spin barrier and free it. A child that exits
// normally let both frees through.
TEST_F(BadFree, TwoThreadsFreeingOneForeignBlockAtOnceAreCaught) {
  const int rounds = 100 / brisk_test::kScale;
  int caught = 0;
  for (int r = 0; r < rounds; ++r) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      alarm(20);  // a hang fails the round (SIGALRM) instead of the whole test run
      void* p = brisk_malloc(64);
      std::atomic<int> arrived{0};
      auto racer = [&] {
        arrived.fetch_add(1);
        while (arrived.load() < 2) {
        }
        brisk_free(p);
      };
      std::thread a(racer), b(racer);
      a.join();
      b.join();
      _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT)
        << "round " << r << " of " << rounds << ": both frees passed (" << caught << " rounds caught before)"
        << (WIFEXITED(status) ? "" : ", or the child died otherwise") << "; stderr: " << err;
    ASSERT_NE(err.find("brisk: double free of"), std::string::npos) << err;
    ++caught;
  }
  EXPECT_EQ(caught, rounds);
}

}  // namespace
