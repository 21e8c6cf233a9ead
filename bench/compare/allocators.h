// Which allocator a name means, where its library is, and whether preloading it took effect.
#ifndef BRISK_BENCH_COMPARE_ALLOCATORS_H
#define BRISK_BENCH_COMPARE_ALLOCATORS_H

#include <optional>
#include <string>
#include <vector>

namespace brisk::bench {

struct Allocator {
  std::string label;    // the name in tables: "brisk", "jemalloc", or the .so's file name
  std::string preload;  // the LD_PRELOAD value; empty for the system allocator
  // NAME=VALUE entries set for this allocator's runs only (after, and over, --env's).
  std::vector<std::string> environment;
};

// The peers `--alloc all` means, in table order.
const std::vector<std::string>& known_allocator_names();

// Resolves "[LABEL=]NAME-OR-PATH[,VAR=VALUE...]": a name or a path to a .so, optionally under a
// label (so one library can appear twice), optionally with environment variables for its runs
// only, e.g. "brisk-debug=brisk,BRISK_DEBUG=1". Without a label, a spec with variables is
// labelled by the whole spec. Returns nullopt with *note set when the allocator is not installed
// or the spec is wrong; *unknown is set for a name that is neither known nor a path, or a
// variable without NAME= (usage errors, not skips).
std::optional<Allocator> resolve_allocator(const std::string& spec, const std::string& brisk_library,
                                           std::string* note, bool* unknown);

// A warning about settings that would not do what they say, or "": MALLOC_CHECK_ for the
// system allocator, which glibc 2.34 and later ignore unless libc_malloc_debug.so is preloaded
// (the run would measure glibc without its checks). glibc_version: gnu_get_libc_version()'s.
std::string environment_warning(const Allocator& allocator, const char* glibc_version);

// Runs the preload probe under the allocator and checks that `malloc` resolves into the preloaded
// library (into libc for the system allocator). ld.so only warns when a preload fails, so
// without this a missing or broken library would be measured as the system allocator.
// Returns true when it did; otherwise sets *note. *detail gets the probe's report either way.
bool preload_took_effect(const Allocator& allocator, const std::string& probe_path, std::string* note,
                         std::string* detail);

}  // namespace brisk::bench

#endif
