#include "core/options.h"

#include <atomic>
#include <cstdlib>

#include "core/platform.h"

namespace brisk::options {
namespace {

struct Option {
  Id id;  // the entry's own id: the table is checked against the enum, row by row
  const char* env;
  std::int64_t default_value;
  std::int64_t min;
  std::int64_t max;
  // For an option set by name: its values' names, the value being the index (nullptr-ended).
  const char* const* names = nullptr;
};

constexpr const char* kDebugActionNames[] = {"abort", "report", nullptr};

constexpr Option kTable[] = {
    {Id::kChunkCache, "BRISK_CHUNK_CACHE", 8, 0, 4096},
    {Id::kLargeCacheBytes, "BRISK_LARGE_CACHE_BYTES", std::int64_t{4} << 30, 0, std::int64_t{1} << 44},
    {Id::kLargeDirtyBytes, "BRISK_LARGE_DIRTY_BYTES", 64 << 20, 0, std::int64_t{1} << 44},
    {Id::kPurgeBytes, "BRISK_PURGE_BYTES", 8 << 20, 0, std::int64_t{1} << 44},
    {Id::kPurgeDelayMs, "BRISK_PURGE_DELAY_MS", 100, 0, 3600 * 1000},
    {Id::kDebugQuarantine, "BRISK_DEBUG_QUARANTINE", 16 << 20, 0, std::int64_t{1} << 40},
    {Id::kDebug, "BRISK_DEBUG", 0, 0, 1},
    {Id::kDebugStackDepth, "BRISK_DEBUG_STACK_DEPTH", 8, 0, 64},
    {Id::kDebugLeaks, "BRISK_DEBUG_LEAKS", 1, 0, 1},
    {Id::kDebugAction, "BRISK_DEBUG_ACTION", 0, 0, 1, kDebugActionNames},
};
constexpr unsigned kOptionCount = static_cast<unsigned>(Id::kCount);
static_assert(sizeof kTable / sizeof kTable[0] == kOptionCount, "one row per option id");
constexpr bool rows_in_id_order() {
  for (unsigned i = 0; i < kOptionCount; ++i)
    if (static_cast<unsigned>(kTable[i].id) != i) return false;
  return true;
}
static_assert(rows_in_id_order(), "kTable's rows must be in Id order: get() indexes by id");

constexpr std::int64_t kUnread = INT64_MIN;
// Every value starts unread (set by the first get() of a process, before any thread exists
// or racing benignly: each reader computes the same value).
std::atomic<std::int64_t> g_values[kOptionCount] = {kUnread, kUnread, kUnread, kUnread, kUnread,
                                                   kUnread, kUnread, kUnread, kUnread, kUnread};
static_assert(kOptionCount == 10, "give a new option its kUnread initialiser above");

// Parses a decimal number with an optional k/m/g suffix. Returns false on junk.
bool parse(const char* s, std::int64_t* out) {
  std::int64_t v = 0;
  if (*s == '\0') return false;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (*s - '0');
  }
  int shift = 0;
  if (*s == 'k' || *s == 'K') shift = 10, ++s;
  else if (*s == 'm' || *s == 'M') shift = 20, ++s;
  else if (*s == 'g' || *s == 'G') shift = 30, ++s;
  if (*s != '\0') return false;
  if (v > (INT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

// The index of s in names (nullptr-ended). Returns false if it is none of them.
bool parse_name(const char* s, const char* const* names, std::int64_t* out) {
  for (std::int64_t i = 0; names[i] != nullptr; ++i) {
    if (__builtin_strcmp(s, names[i]) == 0) {
      *out = i;
      return true;
    }
  }
  return false;
}

}  // namespace

std::int64_t get(Id id) {
  auto i = static_cast<unsigned>(id);
  std::int64_t v = g_values[i].load(std::memory_order_relaxed);
  if (v != kUnread) return v;
  const Option& o = kTable[i];
  v = o.default_value;
  if (const char* s = platform::get_env(o.env)) {
    std::int64_t parsed;
    bool ok = o.names != nullptr ? parse_name(s, o.names, &parsed) : parse(s, &parsed);
    if (ok && parsed >= o.min && parsed <= o.max) {
      v = parsed;
    } else {
      static const char kMsg[] = "brisk: ignoring an invalid value of ";
      platform::write_stderr(kMsg, sizeof kMsg - 1);
      platform::write_stderr(o.env, __builtin_strlen(o.env));
      platform::write_stderr("\n", 1);
    }
  }
  g_values[i].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace brisk::options
