// Linked with brisk (see CMakeLists.txt or ../link-pkgconfig/Makefile): malloc and new are
// served by brisk without any change to the code. Exits 1 if they are not.
#include <brisk/brisk.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// Where does the process's malloc live?
static const char* ObjectDefining(const char* symbol) {
  Dl_info info{};
  void* address = dlsym(RTLD_DEFAULT, symbol);
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

int main() {
  std::printf("malloc comes from %s\n", ObjectDefining("malloc"));
  std::printf("operator new comes from %s\n", ObjectDefining("_Znwm"));

  // Plain malloc and new: both are brisk blocks, so brisk_usable_size knows them.
  char* text = static_cast<char*>(std::malloc(100));
  std::strcpy(text, "hello from brisk");
  auto numbers = std::make_unique<std::vector<int>>(1000, 7);
  std::string name(300, 'x');

  bool ok = std::strstr(ObjectDefining("malloc"), "libbrisk") != nullptr &&
            std::strstr(ObjectDefining("_Znwm"), "libbrisk") != nullptr &&
            brisk_usable_size(text) >= 100 && brisk_usable_size(numbers.get()) >= sizeof(std::vector<int>) &&
            brisk_usable_size(numbers->data()) >= 1000 * sizeof(int) && brisk_usable_size(name.data()) >= 301;
  std::printf("%s; %zu numbers; usable size of the malloc block: %zu\n", text, numbers->size(),
              brisk_usable_size(text));
  std::free(text);

  brisk_stats stats;
  brisk_get_stats(&stats);
  std::printf("brisk has %llu chunk(s) mapped\n", static_cast<unsigned long long>(stats.chunks_mapped));
  std::puts(ok ? "served by brisk" : "NOT served by brisk");
  return ok ? 0 : 1;
}
