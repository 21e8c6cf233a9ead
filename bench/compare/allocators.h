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
};

// The peers `--alloc all` means, in table order.
const std::vector<std::string>& known_allocator_names();

// Resolves "NAME", "PATH.so" or "LABEL=NAME-OR-PATH" (a label lets one library appear twice).
// Returns nullopt with *note set when the allocator is not installed or the name is unknown;
// *unknown is set for a name that is neither known nor a path (a usage error, not a skip).
std::optional<Allocator> resolve_allocator(const std::string& spec, const std::string& brisk_library,
                                           std::string* note, bool* unknown);

// Runs the preload probe under the allocator and checks that `malloc` resolves into the preloaded
// library (into libc for the system allocator). ld.so only warns when a preload fails, so
// without this a missing or broken library would be measured as the system allocator.
// Returns true when it did; otherwise sets *note. *detail gets the probe's report either way.
bool preload_took_effect(const Allocator& allocator, const std::string& probe_path, std::string* note,
                         std::string* detail);

}  // namespace brisk::bench

#endif
