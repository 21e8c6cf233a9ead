// Runtime options: tier 2 of brisk's configuration. One table (options.cc); each option has a
// name, a type, a default and a BRISK_<NAME> environment variable, read once, lazily, on first
// use (never before the environment exists). Documented in the README's "Configuration".
#pragma once

#include <cstddef>
#include <cstdint>

namespace brisk::options {

enum class Id : unsigned {
  kChunkCache,        // BRISK_CHUNK_CACHE: empty 4 MiB chunks kept mapped (decommitted) process-wide
  kLargeCacheBytes,   // BRISK_LARGE_CACHE_BYTES: address space of freed large blocks kept for reuse
  kLargeDirtyBytes,   // BRISK_LARGE_DIRTY_BYTES: of which kept with their pages resident
  kPurgeBytes,        // BRISK_PURGE_BYTES: span bytes a thread releases between purge checks
  kPurgeDelayMs,      // BRISK_PURGE_DELAY_MS: how long a free page stays resident unused before purge
  kDebugQuarantine,   // BRISK_DEBUG_QUARANTINE: bytes of freed debug blocks held back before reuse
  kDebug,             // BRISK_DEBUG: 1 turns debug mode on at start-up
  kDebugStackDepth,   // BRISK_DEBUG_STACK_DEPTH: frames kept per allocation and free (0: none)
  kDebugLeaks,        // BRISK_DEBUG_LEAKS: 0 turns the leak report at exit off
  kDebugAction,       // BRISK_DEBUG_ACTION: abort (0, the default) or report (1): go on after a debug report
  kCount
};

std::int64_t get(Id id);

}  // namespace brisk::options
