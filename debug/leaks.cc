// The leak report at exit (BRISK_DEBUG_LEAKS): live debug blocks grouped by allocation stack,
// largest total first, by default only those the program can no longer reach. See block.h
// (report_leaks) and the README's "Debug mode".
//
// Reachability is a conservative mark from roots, the idea of the Boehm collector's mark phase
// and of LeakSanitizer: every aligned word of the process's resident private writable memory
// (globals of every loaded object, thread stacks, the C library's own data, release-mode
// blocks) but the live debug blocks themselves is a root; a root word whose value lies inside
// a live debug block's user bytes (at its start or anywhere within: a pointer to a member, or
// past a header the program keeps) marks that block reachable, and the words of each block
// marked are scanned the same way. What stays unmarked is a leak: no pointer to it is left.
// Conservative: any word that looks like a pointer counts, so a leak can hide behind a stale
// value (a dead stack slot, a freed block's old contents outside the quarantine's pattern),
// but a block the program still points to is never reported.
//
// Only with no other thread running (the process's thread count is 1): another thread could
// unmap memory under the scan. Otherwise every live block is reported, as with
// BRISK_DEBUG_LEAKS=2, and the report says why.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/lock.h"
#include "core/platform.h"
#include "core/text_writer.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "debug/report.h"
#include "debug/stack_trace.h"

namespace brisk::debug {

namespace {

struct LeakGroup {
  std::uint32_t stack;
  std::uint32_t thread;  // of the group's first block, for a stackless group's report
  std::size_t count;
  std::size_t bytes;
  std::size_t min_size;
  std::size_t max_size;
};
constexpr int kMaxLeakGroups = 256;
LeakGroup g_leak_groups[kMaxLeakGroups];  // report_leaks runs once, at exit

// A live debug block's user bytes, for the mark, as tagged addresses: kTag set, which keeps
// their order and makes them no pointer (not canonical on x86-64 or AArch64). The scan reads
// the stack below its own frames, where sorting and copying these ranges left their values: as
// plain addresses they would mark every block they name.
constexpr std::uintptr_t kTag = std::uintptr_t{1} << 63;
struct LiveRange {
  std::uintptr_t begin;  // tagged
  std::uintptr_t end;    // tagged; begin + user size, at least begin + 1 (an empty block)
  Header* header;
  bool reachable;
};

// The mark's state: the live blocks sorted by address, the worklist of blocks marked and not
// yet scanned, both in one mapping of their own that the root scan leaves out.
struct Mark {
  LiveRange* ranges;
  std::size_t count;
  std::uint32_t* work;
  std::size_t pending;
  std::uintptr_t lowest;   // ranges[0].begin, tagged
  std::uintptr_t highest;  // ranges[count - 1].end, tagged
  std::uintptr_t own_begin, own_end;  // this mapping
};

// v, a word read from memory: marks the block whose user bytes it points into.
BRISK_ALWAYS_INLINE void consider(Mark& m, std::uintptr_t word) {
  if ((word & kTag) != 0) return;  // no pointer to user memory; a tagged range's own copy
  const std::uintptr_t v = word | kTag;
  if (v < m.lowest || v >= m.highest) return;
  const LiveRange* r = std::upper_bound(m.ranges, m.ranges + m.count, v,
                                        [](std::uintptr_t x, const LiveRange& lr) { return x < lr.begin; });
  if (r == m.ranges) return;
  LiveRange& hit = m.ranges[r - m.ranges - 1];
  if (v >= hit.end || hit.reachable) return;
  hit.reachable = true;
  m.work[m.pending++] = static_cast<std::uint32_t>(&hit - m.ranges);
}

// Not instrumented by the sanitizers: the scan reads every word of the memory it is given,
// redzones of AddressSanitizer's stack frames and globals among them, by design.
__attribute__((no_sanitize("address"), no_sanitize("thread"))) void scan_words(Mark& m, std::uintptr_t from,
                                                                                 std::uintptr_t to) {
  from = (from + sizeof(std::uintptr_t) - 1) & ~(sizeof(std::uintptr_t) - 1);
  for (std::uintptr_t a = from; a + sizeof(std::uintptr_t) <= to; a += sizeof(std::uintptr_t))
    consider(m, *reinterpret_cast<const std::uintptr_t*>(a));
}

// A root range: its words, but for the live blocks inside it (scanned when marked) and the
// mark's own mapping.
void scan_root(std::uintptr_t begin, std::uintptr_t end, void* context) {
  Mark& m = *static_cast<Mark*>(context);
  if (begin < m.own_end && end > m.own_begin) {
    if (begin < m.own_begin) scan_root(begin, m.own_begin, context);
    if (end > m.own_end) scan_root(m.own_end, end, context);
    return;
  }
  const LiveRange* r = std::upper_bound(m.ranges, m.ranges + m.count, begin | kTag,
                                        [](std::uintptr_t x, const LiveRange& lr) { return x < lr.end; });
  std::uintptr_t at = begin;
  for (; r != m.ranges + m.count && (r->begin & ~kTag) < end; ++r) {
    if ((r->begin & ~kTag) > at) scan_words(m, at, r->begin & ~kTag);
    at = std::max(at, r->end & ~kTag);
  }
  if (at < end) scan_words(m, at, end);
}

// A marked block's words, its resident pages only (a large block's untouched pages hold
// nothing; reading them would fault them in).
void scan_block(std::uintptr_t begin, std::uintptr_t end, void* context) {
  scan_words(*static_cast<Mark*>(context), begin, end);
}

// Marks the blocks of ranges[0, count) reachable from the roots; false if it could not look
// (another thread runs, or the memory map could not be read or mapped).
bool mark_reachable(LiveRange* ranges, std::size_t count) {
  Mark m{};
  m.ranges = ranges;
  m.count = count;
  m.work = reinterpret_cast<std::uint32_t*>(ranges + count);
  m.lowest = ranges[0].begin;
  m.highest = ranges[count - 1].end;
  m.own_begin = reinterpret_cast<std::uintptr_t>(ranges);
  m.own_end = reinterpret_cast<std::uintptr_t>(m.work + count);
  m.own_end = (m.own_end + kOsPageSize - 1) & ~(kOsPageSize - 1);
  __builtin_unwind_init();  // this thread's callee-saved registers onto its stack, a root
  if (!platform::for_each_resident_writable_run(scan_root, &m)) return false;
  while (m.pending > 0) {
    const LiveRange& r = ranges[m.work[--m.pending]];
    const std::uintptr_t begin = r.begin & ~kTag, end = r.end & ~kTag;
    if (end - begin <= kOsPageSize) {
      scan_words(m, begin, end);
    } else {
      platform::for_each_resident_page_run(begin, end, scan_block, &m);
    }
  }
  return true;
}

// The live debug blocks, counted, then copied into a mapping of their own, sorted.
std::size_t count_live() {
  std::size_t n = 0;
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    LiveLock g(d);
    for (Header* h = d->live; h != nullptr; h = h->next) ++n;
  }
  return n;
}
std::size_t collect_live(LiveRange* ranges, std::size_t capacity) {
  std::size_t n = 0;
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    LiveLock g(d);
    for (Header* h = d->live; h != nullptr && n < capacity; h = h->next) {
      const auto begin = reinterpret_cast<std::uintptr_t>(user_of(h)) | kTag;
      ranges[n++] = LiveRange{begin, begin + (h->user_size == 0 ? 1 : h->user_size), h, false};
    }
  }
  std::sort(ranges, ranges + n, [](const LiveRange& a, const LiveRange& b) { return a.begin < b.begin; });
  return n;
}

void add_to_group(int* groups, std::size_t* ungrouped, std::size_t* ungrouped_bytes, const Header* h) {
  int i = 0;
  while (i < *groups && g_leak_groups[i].stack != h->alloc_stack) ++i;
  if (i == *groups) {
    if (*groups == kMaxLeakGroups) {
      ++*ungrouped;
      *ungrouped_bytes += h->user_size;
      return;
    }
    g_leak_groups[(*groups)++] = LeakGroup{h->alloc_stack, h->alloc_thread, 0, 0, h->user_size, h->user_size};
  }
  LeakGroup& group = g_leak_groups[i];
  ++group.count;
  group.bytes += h->user_size;
  if (h->user_size < group.min_size) group.min_size = h->user_size;
  if (h->user_size > group.max_size) group.max_size = h->user_size;
}

}  // namespace

int report_leaks(LeakScope scope, LeakSummary* summary) {
  LeakSummary sum{};
  if (g_init_state.load(std::memory_order_acquire) != 2) {
    if (summary != nullptr) *summary = sum;
    return 0;
  }
  int groups = 0;
  std::size_t ungrouped = 0, ungrouped_bytes = 0;
  // Reachability, where it can be told: the live blocks sorted, marked from the roots.
  LiveRange* ranges = nullptr;
  std::size_t count = 0, mapped = 0;
  bool single = false;
  if (scope == LeakScope::kUnreachable) {
    single = platform::process_thread_count() == 1;
    const std::size_t live = single ? count_live() : 0;
    if (live > 0 && live < (std::size_t{1} << 32)) {
      mapped = (live * (sizeof(LiveRange) + sizeof(std::uint32_t)) + kOsPageSize - 1) & ~(kOsPageSize - 1);
      ranges = static_cast<LiveRange*>(platform::map(mapped));
    }
    if (ranges != nullptr) {
      count = collect_live(ranges, live);
      sum.scanned = count > 0 && mark_reachable(ranges, count);
    }
  }
  if (sum.scanned) {
    for (std::size_t i = 0; i < count; ++i) {
      const Header* h = ranges[i].header;
      if (ranges[i].reachable) {
        ++sum.reachable_blocks;
        sum.reachable_bytes += h->user_size;
        continue;
      }
      ++sum.reported_blocks;
      sum.reported_bytes += h->user_size;
      add_to_group(&groups, &ungrouped, &ungrouped_bytes, h);
    }
  } else {
    for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
      LiveLock g(d);
      for (Header* h = d->live; h != nullptr; h = h->next) {
        ++sum.reported_blocks;
        sum.reported_bytes += h->user_size;
        add_to_group(&groups, &ungrouped, &ungrouped_bytes, h);
      }
    }
  }
  if (ranges != nullptr) platform::unmap(ranges, mapped);
  // Largest total first, so the worst leak heads the log (a selection sort: few groups).
  for (int i = 0; i < groups; ++i) {
    int best = i;
    for (int j = i + 1; j < groups; ++j)
      if (g_leak_groups[j].bytes > g_leak_groups[best].bytes) best = j;
    LeakGroup t = g_leak_groups[i];
    g_leak_groups[i] = g_leak_groups[best];
    g_leak_groups[best] = t;
  }
  static char text[kReportCapacity];
  for (int i = 0; i < groups; ++i) {
    const LeakGroup& group = g_leak_groups[i];
    TextWriter w(text, sizeof text);
    w.text("brisk: leak: ");
    w.decimal(group.count);
    w.text(group.count == 1 ? " block, " : " blocks, ");
    w.decimal(group.bytes);
    w.text(" bytes (sizes ");
    w.decimal(group.min_size);
    if (group.max_size != group.min_size) {
      w.text("..");
      w.decimal(group.max_size);
    }
    w.text(sum.scanned ? ") unreachable at exit, allocated by thread " : ") still allocated at exit, allocated by thread ");
    w.decimal(group.thread);
    w.text(":\n");
    const std::uintptr_t* frames = nullptr;
    int depth = g_depot.fetch(group.stack, &frames);
    if (depth <= 0) w.text("    (no stack recorded)\n");
    for (int f = 0; f < depth; ++f) {
      w.text("    #");
      w.decimal(static_cast<std::uint64_t>(f));
      w.put(' ');
      char frame[512];
      w.text(frame, format_frame(frames[f], frame, sizeof frame));
      w.put('\n');
    }
    emit_report(text, w.finish("(report truncated)\n"));
  }
  if (ungrouped > 0) {
    TextWriter w(text, sizeof text);
    w.text("brisk: leak: ");
    w.decimal(ungrouped);
    w.text(" more blocks, ");
    w.decimal(ungrouped_bytes);
    w.text(" bytes, from more allocation stacks than the report groups\n");
    emit_report(text, w.finish());
  }
  if (sum.scanned && sum.reachable_blocks > 0) {
    TextWriter w(text, sizeof text);
    w.text("brisk: leaks: not listed, ");
    w.decimal(sum.reachable_blocks);
    w.text(sum.reachable_blocks == 1 ? " block, " : " blocks, ");
    w.decimal(sum.reachable_bytes);
    w.text(" bytes still allocated at exit that the program can still reach (from its globals, stacks or other "
           "blocks); BRISK_DEBUG_LEAKS=2 lists them too\n");
    emit_report(text, w.finish());
  } else if (scope == LeakScope::kUnreachable && !single && groups > 0) {
    TextWriter w(text, sizeof text);
    w.text("brisk: leaks: other threads still run at exit, so every live block is listed, reachable or not\n");
    emit_report(text, w.finish());
  }
  sum.groups = groups;
  if (summary != nullptr) *summary = sum;
  return groups;
}

}  // namespace brisk::debug
