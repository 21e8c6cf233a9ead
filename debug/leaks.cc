// The leak report at exit (BRISK_DEBUG_LEAKS): live debug blocks grouped by allocation stack,
// largest total first. See block.h (report_leaks) and the README's "Debug mode".
#include <cstddef>
#include <cstdint>

#include "core/lock.h"
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

}  // namespace

int report_leaks() {
  if (g_init_state.load(std::memory_order_acquire) != 2) return 0;
  int groups = 0;
  std::size_t ungrouped = 0, ungrouped_bytes = 0;
  for (DebugHeap* d = first_debug_heap(); d != nullptr; d = d->registry_next) {
    LiveLock g(d);
    for (Header* h = d->live; h != nullptr; h = h->next) {
      int i = 0;
      while (i < groups && g_leak_groups[i].stack != h->alloc_stack) ++i;
      if (i == groups) {
        if (groups == kMaxLeakGroups) {
          ++ungrouped;
          ungrouped_bytes += h->user_size;
          continue;
        }
        g_leak_groups[groups++] = LeakGroup{h->alloc_stack, h->alloc_thread, 0, 0, h->user_size, h->user_size};
      }
      LeakGroup& group = g_leak_groups[i];
      ++group.count;
      group.bytes += h->user_size;
      if (h->user_size < group.min_size) group.min_size = h->user_size;
      if (h->user_size > group.max_size) group.max_size = h->user_size;
    }
  }
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
    w.text(") still allocated at exit, allocated by thread ");
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
  return groups;
}

}  // namespace brisk::debug
