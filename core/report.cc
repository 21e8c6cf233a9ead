#include "core/report.h"

#include "core/assert.h"

#include <cstdint>
#include <cstring>

#include "core/platform.h"

namespace brisk {
namespace {

char* append(char* out, char* end, const char* s) {
  while (*s != '\0' && out < end) *out++ = *s++;
  return out;
}

char* append_hex(char* out, char* end, std::uintptr_t v) {
  char digits[2 + 16];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0);
  out = append(out, end, "0x");
  while (n > 0 && out < end) *out++ = digits[--n];
  return out;
}

char* append_decimal(char* out, char* end, unsigned long v) {
  char digits[20];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0 && out < end) *out++ = digits[--n];
  return out;
}

}  // namespace

void assert_failed(const char* condition, const char* file, int line) {
  char text[512];
  char* end = text + sizeof text - 1;
  char* out = append(text, end, "brisk: assertion failed: ");
  out = append(out, end, condition);
  out = append(out, end, " at ");
  out = append(out, end, file);
  out = append(out, end, ":");
  out = append_decimal(out, end, static_cast<unsigned long>(line));
  *out++ = '\n';
  platform::write_stderr(text, static_cast<std::size_t>(out - text));
  platform::abort_process();
}

void fatal_pointer_error(const char* what, const void* ptr, const char* detail) {
  char line[256];
  char* end = line + sizeof line - 1;
  char* out = append(line, end, "brisk: ");
  out = append(out, end, what);
  out = append(out, end, " ");
  out = ptr == nullptr ? append(out, end, "(nil)") : append_hex(out, end, reinterpret_cast<std::uintptr_t>(ptr));
  if (detail != nullptr) {
    out = append(out, end, ": ");
    out = append(out, end, detail);
  }
  *out++ = '\n';
  platform::write_stderr(line, static_cast<std::size_t>(out - line));
  platform::abort_process();
}

}  // namespace brisk
