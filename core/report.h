// Fatal error reports: one line on stderr naming the pointer, then abort. Formats numbers by
// hand because printf may allocate.
#pragma once

namespace brisk {

// Writes "brisk: <what> <ptr>[: <detail>]" and aborts.
[[noreturn]] void fatal_pointer_error(const char* what, const void* ptr, const char* detail);

}  // namespace brisk
