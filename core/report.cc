#include "core/report.h"

#include "core/assert.h"

#include <cstdint>
#include <cstring>

#include "core/platform.h"
#include "core/text_writer.h"

namespace brisk {

void assert_failed(const char* condition, const char* file, int line) {
  char text[512];
  TextWriter w(text, sizeof text - 1);  // room for the newline after finish()
  w.text("brisk: assertion failed: ");
  w.text(condition);
  w.text(" at ");
  w.text(file);
  w.put(':');
  w.decimal(static_cast<std::uint64_t>(line));
  std::size_t n = w.finish();
  text[n++] = '\n';
  platform::write_stderr(text, n);
  platform::abort_process();
}

void fatal_pointer_error(const char* what, const void* ptr, const char* detail) {
  char line[256];
  TextWriter w(line, sizeof line - 1);
  w.text("brisk: ");
  w.text(what);
  w.put(' ');
  if (ptr == nullptr) {
    w.text("(nil)");
  } else {
    w.text("0x");
    w.hex(reinterpret_cast<std::uintptr_t>(ptr), 1);
  }
  if (detail != nullptr) {
    w.text(": ");
    w.text(detail);
  }
  std::size_t n = w.finish();
  line[n++] = '\n';
  platform::write_stderr(line, n);
  platform::abort_process();
}

}  // namespace brisk
