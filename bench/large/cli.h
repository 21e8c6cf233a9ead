// Command-line helpers shared by the bench's standalone loops (brisk-large-loop,
// brisk-grow-loop): options that take a whole number, and the usage line on a wrong one.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
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

// One "--name N" option: its value goes to *value, a whole number from 1 to max.
struct CountOption {
  const char* name;
  unsigned long* value;
  unsigned long max;
};

// Reads argv's "--name N" pairs into the options' values; a usage error on anything else.
inline void parse_counts(int argc, char** argv, const char* tool, const char* synopsis,
                         std::initializer_list<CountOption> options) {
  for (int i = 1; i < argc; i += 2) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(tool, synopsis, "unknown option or missing value: " + arg);
    const CountOption* match = nullptr;
    for (const CountOption& o : options)
      if (arg == o.name) match = &o;
    if (match == nullptr) usage(tool, synopsis, "unknown option " + arg);
    *match->value = parse_count(tool, synopsis, match->name, argv[i + 1], match->max);
  }
}

}  // namespace brisk::bench
