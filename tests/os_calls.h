// The platform calls a test counts around one operation (large_test, large_realloc_test).
#pragma once

#include <cstdint>

#include "core/stats.h"

namespace brisk {

// The platform calls a large free might make: unmap, decommit, and mincore.
struct OsCalls {
  std::uint64_t map = stats::g.os_map_calls.load();
  std::uint64_t unmap = stats::g.os_unmap_calls.load();
  std::uint64_t decommit = stats::g.os_decommit_calls.load();
  std::uint64_t resident = stats::g.os_resident_calls.load();
};

}  // namespace brisk
