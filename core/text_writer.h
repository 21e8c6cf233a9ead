// TextWriter: appends text and numbers to a fixed buffer without malloc, for fatal reports
// (core/report.cc), debug reports and frame names (debug/report.cc, debug/stack_trace.cc). What
// does not fit is dropped and remembered.
#pragma once

#include <cstddef>
#include <cstdint>

namespace brisk {

class TextWriter {
 public:
  // Holds at most capacity - 1 characters and the NUL; a capacity of 0 holds nothing.
  TextWriter(char* out, std::size_t capacity)
      : out_(out), end_(capacity == 0 ? nullptr : out + capacity - 1), at_(capacity == 0 ? nullptr : out) {}

  void text(const char* s) {
    while (*s != '\0') put(*s++);
  }
  void text(const char* s, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) put(s[i]);
  }
  void decimal(std::uint64_t v) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0) put(digits[--n]);
  }
  void hex(std::uint64_t v, int min_digits) {
    if (min_digits > 16) min_digits = 16;  // a 64-bit value has 16 hex digits
    char digits[16];
    int n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v != 0 || n < min_digits);
    while (n > 0) put(digits[--n]);
  }
  void put(char c) {
    if (at_ < end_) {
      *at_++ = c;
    } else {
      full_ = true;
    }
  }
  // Ends the text with a NUL and returns its length. If something was dropped and `marker` is
  // given, the marker replaces the text's tail, so a cut is visible.
  std::size_t finish(const char* marker = nullptr) {
    if (capacity_zero()) return 0;
    std::size_t marker_length = 0;
    if (marker != nullptr) marker_length = __builtin_strlen(marker);
    if (full_ && marker_length > 0 && static_cast<std::size_t>(end_ - out_) >= marker_length) {
      at_ = end_ - marker_length;
      for (const char* s = marker; *s != '\0'; ++s) *at_++ = *s;
    }
    *at_ = '\0';
    return static_cast<std::size_t>(at_ - out_);
  }

 private:
  char* out_;
  char* end_;
  char* at_;
  bool full_ = false;

  bool capacity_zero() const { return end_ == nullptr; }
};

}  // namespace brisk
