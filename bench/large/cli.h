// Command-line helpers shared by the bench's standalone loops (brisk-large-loop,
// brisk-grow-loop): options that take a whole number, and the usage line on a wrong one.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace brisk::bench {

// Prints "TOOL: MESSAGE (usage: TOOL SYNOPSIS)" and exits with status 2.
[[noreturn]] inline void usage(const char* tool, const char* synopsis, const std::string& message) {
  std::fprintf(stderr, "%s: %s (usage: %s %s)\n", tool, message.c_str(), tool, synopsis);
  std::exit(2);
}

// The value of option `name`, a whole number from 1 to max; a usage error otherwise.
inline unsigned long parse_count(const char* tool, const char* synopsis, const char* name, const char* text,
                                 unsigned long max) {
  char* end = nullptr;
  unsigned long v = std::strtoul(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v == 0 || v > max)
    usage(tool, synopsis, std::string(name) + " wants a whole number from 1 to " + std::to_string(max));
  return v;
}

}  // namespace brisk::bench
