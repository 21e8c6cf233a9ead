#include "bench/compare/allocators.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "bench/compare/measure.h"

namespace brisk::bench {
namespace {

struct Peer {
  const char* name;
  const char* library;  // file name in the multiarch library directory; empty for brisk/system
};

// Debian's runtime packages: libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0, libtbbmalloc2.
constexpr Peer kPeers[] = {
    {"brisk", ""},
    {"system", ""},
    {"jemalloc", "libjemalloc.so.2"},
    {"tcmalloc", "libtcmalloc_minimal.so.4"},
    {"mimalloc", "libmimalloc.so.2"},
    {"tbbmalloc", "libtbbmalloc_proxy.so.2"},
};

constexpr const char* kLibraryDirectories[] = {
    "/usr/lib/x86_64-linux-gnu/", "/usr/lib/aarch64-linux-gnu/", "/usr/lib64/", "/usr/lib/", "/usr/local/lib/",
};

std::string real_path(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return path;
  return resolved;
}

bool readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

const std::vector<std::string>& known_allocator_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Peer& peer : kPeers) v.emplace_back(peer.name);
    return v;
  }();
  return names;
}

std::optional<Allocator> resolve_allocator(const std::string& spec, const std::string& brisk_library,
                                           std::string* note, bool* unknown) {
  *unknown = false;
  // The variables follow the first comma; the label is before the first '=' ahead of it.
  const std::size_t comma = spec.find(',');
  const std::string head = spec.substr(0, comma);
  Allocator allocator;
  if (comma != std::string::npos) {
    std::size_t start = comma + 1;
    while (true) {
      const std::size_t end = spec.find(',', start);
      const std::string variable = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
      const std::size_t equals = variable.find('=');
      if (equals == std::string::npos || equals == 0) {
        *unknown = true;
        *note = "--alloc " + spec + ": '" + variable + "' is not VAR=VALUE";
        return std::nullopt;
      }
      allocator.environment.push_back(variable);
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  std::string label = comma == std::string::npos ? "" : spec;
  std::string what = head;
  const std::size_t equals = head.find('=');
  if (equals != std::string::npos) {
    label = head.substr(0, equals);
    what = head.substr(equals + 1);
  }
  if (what == "system") {
    allocator.label = label.empty() ? "system" : label;
    return allocator;
  }
  if (what == "brisk") {
    allocator.label = label.empty() ? "brisk" : label;
    if (brisk_library.empty() || !readable(brisk_library)) {
      *note = "skipping brisk: libbrisk.so not found (" + (brisk_library.empty() ? std::string("not built") : brisk_library) +
              "; build target brisk_shared or pass --brisk-lib PATH)";
      return std::nullopt;
    }
    allocator.preload = real_path(brisk_library);
    return allocator;
  }
  for (const Peer& peer : kPeers) {
    if (what != peer.name || peer.library[0] == '\0') continue;
    allocator.label = label.empty() ? peer.name : label;
    for (const char* directory : kLibraryDirectories) {
      const std::string candidate = std::string(directory) + peer.library;
      if (readable(candidate)) {
        allocator.preload = candidate;
        return allocator;
      }
    }
    *note = "skipping " + allocator.label + ": " + peer.library + " is not installed";
    return std::nullopt;
  }
  if (what.find('/') == std::string::npos && what.find(".so") == std::string::npos) {
    *unknown = true;
    *note = "unknown allocator '" + what + "' (expected one of brisk system jemalloc tcmalloc mimalloc tbbmalloc all, or a path to a .so)";
    return std::nullopt;
  }
  allocator.label = label.empty() ? base_name(what) : label;
  if (!readable(what)) {
    *note = "skipping " + allocator.label + ": " + what + " does not exist";
    return std::nullopt;
  }
  // ld.so resolves a preload without a slash through the library path; always pass a full path.
  allocator.preload = real_path(what);
  return allocator;
}

std::string environment_warning(const Allocator& allocator, const char* glibc_version) {
  bool check = false;
  for (const std::string& variable : allocator.environment) check |= variable.rfind("MALLOC_CHECK_=", 0) == 0;
  if (!check || !allocator.preload.empty()) return "";
  int major = 0, minor = 0;
  if (std::sscanf(glibc_version, "%d.%d", &major, &minor) != 2 || major < 2 || (major == 2 && minor < 34)) return "";
  return allocator.label + ": glibc " + glibc_version +
         " ignores MALLOC_CHECK_ unless libc_malloc_debug.so is preloaded, so this runs glibc without its checks;"
         " use LABEL=/usr/lib/<multiarch>/libc_malloc_debug.so.0,MALLOC_CHECK_=...";
}

bool preload_took_effect(const Allocator& allocator, const std::string& probe_path, std::string* note,
                         std::string* detail) {
  RunOptions options;
  options.preload = allocator.preload;
  options.environment = allocator.environment;
  const RunResult run = run_measured({probe_path}, options);
  // The probe prints "malloc=PATH" and then "operator_new=PATH"; we only get its last line
  // from run_measured, so it prints both on one line: "malloc=PATH operator_new=PATH".
  *detail = run.last_line;
  if (run.exit_code != 0) {
    *note = "skipping " + allocator.label + ": the preload probe failed under it (exit " +
            std::to_string(run.exit_code) + "): " + run.stderr_tail.substr(0, run.stderr_tail.find('\n'));
    return false;
  }
  std::string malloc_owner;
  std::istringstream fields(run.last_line);
  std::string field;
  while (fields >> field) {
    if (field.rfind("malloc=", 0) == 0) malloc_owner = field.substr(7);
  }
  if (allocator.preload.empty()) {
    if (base_name(malloc_owner).rfind("libc.so", 0) == 0) return true;
    *note = "skipping " + allocator.label + ": malloc came from " + malloc_owner + ", not libc";
    return false;
  }
  if (real_path(malloc_owner) == real_path(allocator.preload)) return true;
  *note = "skipping " + allocator.label + ": LD_PRELOAD=" + allocator.preload + " did not take effect (malloc came from " +
          (malloc_owner.empty() ? std::string("nowhere") : malloc_owner) + ")";
  if (!run.stderr_tail.empty()) *note += ": " + run.stderr_tail.substr(0, run.stderr_tail.find('\n'));
  return false;
}

}  // namespace brisk::bench
