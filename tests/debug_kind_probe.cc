// Debug mode through the replaced malloc and operator new (linked with libbrisk.so, run with
// BRISK_DEBUG=1 BRISK_DEBUG_ACTION=report): a free by the wrong family is reported with the
// right words, a matching one is not. Prints what failed and exits 1; 0 when all held.
#include <brisk/brisk.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

extern "C" void free_sized(void* p, size_t size);  // C23; glibc's headers may lack it

namespace {

std::string g_reports;
int g_count = 0;

void Collect(const char* text, size_t length, void*) {
  g_reports.append(text, length);
  ++g_count;
}

int g_failures = 0;

// Runs f, which must produce exactly one report containing `expect` (or none when expect is
// nullptr).
template <typename F>
void Expect(const char* name, const char* expect, F f) {
  g_reports.clear();
  g_count = 0;
  f();
  bool ok = expect == nullptr ? g_count == 0 : g_count == 1 && g_reports.find(expect) != std::string::npos;
  if (!ok) {
    std::fprintf(stderr, "FAIL %s: %d reports, wanted %s:\n%s\n", name, g_count, expect ? expect : "none",
                 g_reports.c_str());
    ++g_failures;
  }
}

// Opaque to the compiler, so that no new/delete pair is elided or diagnosed.
void* volatile g_sink;
template <typename T>
T* Launder(T* p) {
  g_sink = p;
  return static_cast<T*>(g_sink);
}

}  // namespace

int main() {
  if (!brisk_debug_active()) {
    std::fprintf(stderr, "FAIL: run with BRISK_DEBUG=1\n");
    return 1;
  }
  brisk_debug_set_report_callback(Collect, nullptr);
  Expect("new/delete", nullptr, [] { delete Launder(new int(1)); });
  Expect("new[]/delete[]", nullptr, [] { delete[] Launder(new int[40]); });
  Expect("malloc/free", nullptr, [] { std::free(Launder(std::malloc(40))); });
  Expect("big new[]/delete[]", nullptr, [] { delete[] Launder(new char[300000]); });
  Expect("free of new[]", "free of a block made by new[]", [] { std::free(Launder(new int[4])); });
  Expect("free of big new", "free of a block made by new",
         [] { std::free(Launder(new char[sizeof(int) * 100000])); });
  Expect("delete of malloc", "delete of a block made by malloc", [] { delete Launder(static_cast<int*>(std::malloc(8))); });
  Expect("delete[] of new", "delete[] of a block made by new", [] { delete[] Launder(new int(2)); });
  Expect("delete of new[]", "delete of a block made by new[]", [] { delete Launder(new int[3]); });
  Expect("free_sized with the right size", nullptr, [] { free_sized(Launder(std::malloc(24)), 24); });
  Expect("free_sized with a wrong size", "sized free with a size", [] { free_sized(Launder(std::malloc(24)), 32); });
  Expect("sized delete with the right size", nullptr, [] { ::operator delete(Launder(::operator new(24)), 24); });
  Expect("sized delete with a wrong size", "sized free with a size",
         [] { ::operator delete(Launder(::operator new(24)), 32); });
  Expect("sized delete[] with a wrong size", "sized free with a size",
         [] { ::operator delete[](Launder(::operator new[](100000)), 100001); });
  Expect("sized aligned delete with a wrong size", "sized free with a size", [] {
    ::operator delete(Launder(::operator new(40, std::align_val_t{64})), 48, std::align_val_t{64});
  });
  // BRISK_DEBUG_ACTION=report: a free by the wrong family frees the block all the same (it goes
  // to the quarantine), so the right free after it is a double free, and nothing is damaged.
  int* array = Launder(new int[8]);
  Expect("free of new[] in report mode", "free of a block made by new[]", [array] { std::free(array); });
  Expect("then its delete[]", "brisk: double free", [array] { delete[] array; });
  void* block = Launder(std::malloc(64));
  Expect("delete of malloc in report mode", "delete of a block made by malloc", [block] { delete static_cast<char*>(block); });
  Expect("then its free", "brisk: double free", [block] { std::free(block); });
  Expect("a heap check after them", nullptr, [] {
    if (brisk_check_heap() != 0) Collect("brisk_check_heap found damage", 29, nullptr);
  });
  brisk_debug_set_report_callback(nullptr, nullptr);
  if (g_failures == 0) std::printf("debug_kind_probe: all kinds checked\n");
  return g_failures == 0 ? 0 : 1;
}
