#include "core/stats.h"

namespace brisk::stats {
Counters g;
}  // namespace brisk::stats
