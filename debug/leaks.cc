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
// but a block the program still points to from the memory read is never reported.
//
// The other threads of the process are stopped while the mark reads (core/platform_stop.h:
// ptrace from a helper process, as LeakSanitizer does), their registers copied into a mapping
// that the mark reads as a root; brisk's own background thread is also held before its next
// pass (background_pause_within). Running, a thread could unmap memory under the scan, or move a
// pointer from a word not yet read to one already read. Where they cannot be stopped (a debugger
// already traces the process, ptrace is forbidden; the report names the reason) every live
// block is reported, as with BRISK_DEBUG_LEAKS=2, and the report says why; where a lock the
// report needs stays held (exit called by a signal handler inside the allocator), one line says
// there is no report (report_leaks). Words are read only
// in readable mappings (a program may mprotect part of a block), roots only in private
// writable ones up to 64 GiB that are no device (/dev/zero is); shared mappings, swapped-out
// pages and words at unaligned addresses are not read, so a block reachable only through them
// is listed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/lock.h"
#include "core/platform.h"
#include "core/platform_stop.h"
#include "core/text_writer.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "debug/report.h"
#include "debug/stack_trace.h"
#include "threadcache/background.h"

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
char g_why_text[256];  // why reachability was not told, when it is composed

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

// A readable mapping of the process, from /proc/self/maps; root: also a root of the mark.
struct Readable {
  std::uintptr_t begin, end;
  bool root;
  bool main_stack;  // the kernel's stack of the main thread ("[stack]")
};
// At most this many readable mappings are kept (Linux's default vm.max_map_count is 65,530);
// past it, the blocks in the mappings left out are not scanned (their referents may then be
// listed: the report says so).
constexpr std::size_t kMaxReadable = 65536;
// Larger than any heap, stack or data segment: a reservation (a sanitizer's shadow memory is
// terabytes), whose mincore walk alone would take seconds. Not a root.
constexpr std::uintptr_t kMaxRootMapping = std::uintptr_t{64} << 30;

// The mark's state: the live blocks sorted by address, the worklist of blocks marked and not
// yet scanned and the readable mappings, all in one mapping of their own that the root scan
// leaves out.
struct Mark {
  LiveRange* ranges;
  std::size_t count;
  std::uint32_t* work;
  std::size_t pending;
  Readable* readable;
  std::size_t readable_count;
  bool readable_overflow;
  std::uintptr_t lowest;   // ranges[0].begin, tagged
  std::uintptr_t highest;  // ranges[count - 1].end, tagged
  std::uintptr_t own_begin, own_end;  // this mapping
  // This thread's dead stack, below the frame of the root scan (scan_roots): not a root.
  std::uintptr_t dead_begin, dead_end;
};

// The bytes a mapping of the mark's needs for count live blocks.
std::size_t mark_bytes(std::size_t count) {
  const std::size_t bytes = count * sizeof(LiveRange) + count * sizeof(std::uint32_t) +
                            alignof(Readable) + kMaxReadable * sizeof(Readable);
  return (bytes + kOsPageSize - 1) & ~(kOsPageSize - 1);
}

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
// ranges of root mappings that are no roots: the mark's own mapping and the dead stack below
// the scan.
void scan_root(std::uintptr_t begin, std::uintptr_t end, void* context) {
  Mark& m = *static_cast<Mark*>(context);
  const std::uintptr_t no_roots[2][2] = {{m.own_begin, m.own_end}, {m.dead_begin, m.dead_end}};
  for (const auto& [from, to] : no_roots) {
    if (begin >= to || end <= from) continue;
    if (begin < from) scan_root(begin, from, context);
    if (end > to) scan_root(to, end, context);
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

// Records each readable mapping; roots: private, writable, not a device (but /dev/zero, which
// mapped privately is anonymous memory), not a reservation.
void record_mapping(const platform::Mapping& mapping, void* context) {
  Mark& m = *static_cast<Mark*>(context);
  if (!mapping.readable) return;
  if (m.readable_count == kMaxReadable) {
    m.readable_overflow = true;
    return;
  }
  const bool device = std::strncmp(mapping.path, "/dev/", 5) == 0 && std::strcmp(mapping.path, "/dev/zero") != 0;
  const bool root = mapping.writable && mapping.is_private && !device && mapping.end - mapping.begin <= kMaxRootMapping;
  m.readable[m.readable_count++] = Readable{mapping.begin, mapping.end, root, std::strcmp(mapping.path, "[stack]") == 0};
}

// A marked block's words where its pages are readable: a program may have made some of them
// inaccessible (mprotect), which mincore does not tell. Blocks of up to 64 KiB are read
// whole (a live block's pages are resident, or read as zeros); larger ones over their resident
// pages only.
void scan_marked(Mark& m, std::uintptr_t begin, std::uintptr_t end) {
  const Readable* r = std::upper_bound(m.readable, m.readable + m.readable_count, begin,
                                       [](std::uintptr_t x, const Readable& rd) { return x < rd.end; });
  for (; r != m.readable + m.readable_count && r->begin < end; ++r) {
    const std::uintptr_t from = std::max(begin, r->begin), to = std::min(end, r->end);
    if (to - from <= 64 * 1024) {
      scan_words(m, from, to);
    } else {
      platform::for_each_resident_page_run(from, to, scan_block, &m);
    }
  }
}

// Every root mapping's resident words (scan_root), but the main thread's stack only from this
// function's frame up when the scan runs there: below it lies dead stack, where the report's own
// work (walking the live lists, sorting the blocks' ranges) leaves copies of block addresses,
// which marked leaked blocks reachable (debug_leak_test under ThreadSanitizer, whose
// instrumented code spills more: the chain whose root was lost went unreported in about 1 run
// in 150). The caller's frame, with the callee-saved registers that __builtin_unwind_init saved
// there, lies above this one, wherever in it the compiler put them. Only the kernel's "[stack]"
// mapping, which holds the main thread's frames only, and only kDeadStack bytes below the frame:
// elsewhere the memory below a frame need not be dead (a coroutine's stack carved from a mapping
// or a block that holds other coroutines' stacks and data, a thread's stack without a guard page
// next to other memory), and leaving live words out would list reachable blocks. So a report
// made on another thread reads its stack whole, as it reads other threads' (a dead value there
// can only hide a leak). The one case left: a program that runs coroutines on buffers in the
// main thread's frames and exits from one of them could lose the roots of the others below it.
constexpr std::uintptr_t kDeadStack = 256 * 1024;  // far more than the report's own frames use
__attribute__((noinline, no_sanitize("address"))) void scan_roots(Mark& m) {
  const auto live_from = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  m.dead_begin = m.dead_end = 0;
  for (std::size_t i = 0; i < m.readable_count; ++i)
    if (m.readable[i].main_stack && m.readable[i].begin <= live_from && live_from < m.readable[i].end) {
      m.dead_begin = live_from - m.readable[i].begin > kDeadStack ? live_from - kDeadStack : m.readable[i].begin;
      m.dead_end = live_from;
    }
  for (std::size_t i = 0; i < m.readable_count; ++i)
    if (m.readable[i].root) platform::for_each_resident_page_run(m.readable[i].begin, m.readable[i].end, scan_root, &m);
}

// Marks the blocks of ranges[0, count) reachable from the roots, in a mapping of mark_bytes
// (count) at ranges; false if the memory map could not be read. Not instrumented by
// AddressSanitizer: with __builtin_unwind_init in it, GCC 12 left its frame's redzones
// poisoned after it returned, and a later frame there was reported as a use after scope.
__attribute__((no_sanitize("address"))) bool mark_reachable(LiveRange* ranges, std::size_t count, bool* overflow) {
  Mark m{};
  m.ranges = ranges;
  m.count = count;
  m.work = reinterpret_cast<std::uint32_t*>(ranges + count);
  auto readable = reinterpret_cast<std::uintptr_t>(m.work + count);
  readable = (readable + alignof(Readable) - 1) & ~(alignof(Readable) - 1);
  m.readable = reinterpret_cast<Readable*>(readable);
  m.lowest = ranges[0].begin;
  m.highest = ranges[count - 1].end;
  m.own_begin = reinterpret_cast<std::uintptr_t>(ranges);
  m.own_end = m.own_begin + mark_bytes(count);
  // No mapping read (a process's maps file reads empty once its main thread has exited, hence
  // the thread's own) would make every block a leak.
  if (!platform::for_each_mapping(record_mapping, &m) || m.readable_count == 0) return false;
  *overflow = m.readable_overflow;
  __builtin_unwind_init();  // this thread's callee-saved registers onto its stack, a root
  scan_roots(m);
  while (m.pending > 0) {
    const LiveRange& r = ranges[m.work[--m.pending]];
    scan_marked(m, r.begin & ~kTag, r.end & ~kTag);
  }
  return true;
}

// Every debug heap's live lock, with the blocks made before it on the live list, for the
// report, taken in registry order as fork's prepare takes them (debug_heap.cc's
// heaps_lock_all): no thread holds two otherwise. *head: the registry's head then; a heap made
// later (new heaps are prepended) is not locked, and the walks below start from *head. Each
// wait is bounded (kLockWaitMs): exit() called from a signal handler that interrupted a debug
// allocation or free finds that thread's own lock held, for ever. False: one stayed held, and
// none is left taken.
constexpr std::uint64_t kLockWaitMs = 1000;
void unlock_live_lists(DebugHeap* from, DebugHeap* to) {
  for (DebugHeap* d = from; d != to; d = d->registry_next) d->live_lock.unlock();
}
bool lock_every_live_list(DebugHeap** head) {
  *head = first_debug_heap();
  for (DebugHeap* d = *head; d != nullptr; d = d->registry_next) {
    if (!d->live_lock.lock_within(kLockWaitMs)) {
      unlock_live_lists(*head, d);
      return false;
    }
    link_made(d);
  }
  return true;
}

// The live debug blocks (every live list locked), counted, then copied into a mapping of their
// own, sorted.
std::size_t count_live(DebugHeap* head) {
  std::size_t n = 0;
  for (DebugHeap* d = head; d != nullptr; d = d->registry_next)
    for (Header* h = d->live; h != nullptr; h = h->next) ++n;
  return n;
}
std::size_t collect_live(DebugHeap* head, LiveRange* ranges, std::size_t capacity) {
  std::size_t n = 0;
  for (DebugHeap* d = head; d != nullptr; d = d->registry_next)
    for (Header* h = d->live; h != nullptr && n < capacity; h = h->next) {
      const auto begin = reinterpret_cast<std::uintptr_t>(user_of(h)) | kTag;
      ranges[n++] = LiveRange{begin, begin + (h->user_size == 0 ? 1 : h->user_size), h, false};
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

// The one line of a report that could not be made.
void emit_unavailable(const char* why) {
  static char text[256];
  TextWriter w(text, sizeof text);
  w.text("brisk: leaks: no report: ");
  w.text(why);
  w.put('\n');
  emit_report(text, w.finish());
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
  const char* why_all = nullptr;  // why reachability was not told, for the report
  bool overflow = false;
  // brisk's own background thread (if started) waits before its next pass until the report is
  // done: its passes give memory back, which could unmap what the scan reads. Then every live
  // list is locked, for the scan and the listing, before other threads stop (LeakSanitizer
  // locks its allocator first): a thread stopped inside a debug allocation or free would
  // otherwise hold one, and one waiting for a lock the report holds stops in its wait. A debug
  // heap made meanwhile is left out, with its blocks (a thread's first debug block, at exit).
  std::size_t background = 0;
  DebugHeap* head = nullptr;
  if (!background_pause_within(kLockWaitMs, &background)) {
    emit_unavailable("brisk's background thread did not finish its pass");
    if (summary != nullptr) *summary = sum;
    return 0;
  }
  if (!lock_every_live_list(&head)) {
    background_resume();
    emit_unavailable("a debug heap's lock stayed held (exit called inside the allocator, from a signal handler?)");
    if (summary != nullptr) *summary = sum;
    return 0;
  }
  if (scope == LeakScope::kUnreachable) {
    const std::size_t threads = platform::process_thread_count();
    const bool others = threads != 1 + background;
    if (threads == 0) {
      why_all = "the thread count could not be read (/proc/self/stat)";
    } else if (others && !platform::stop_other_threads()) {
      TextWriter w(g_why_text, sizeof g_why_text);
      w.text("other threads still run at exit, and they could not be stopped for the scan: ");
      w.text(platform::stop_failure());
      w.finish();
      why_all = g_why_text;
    } else {
      const std::size_t live = count_live(head);
      if (live > 0 && live < (std::size_t{1} << 32)) {
        mapped = mark_bytes(live);
        ranges = static_cast<LiveRange*>(platform::map(mapped));
        if (ranges == nullptr) why_all = "no memory for the scan";
      }
      if (ranges != nullptr) {
        count = collect_live(head, ranges, live);
        sum.scanned = count > 0 && mark_reachable(ranges, count, &overflow);
        if (count > 0 && !sum.scanned) why_all = "the memory map (/proc/thread-self/maps) could not be read";
      }
      if (others) {
        sum.threads_stopped = platform::stopped_thread_count();
        platform::resume_other_threads();
      }
    }
  }
  // The groups, read from the headers while the lists are locked (a running thread could free
  // and reuse a block); reported once they are not (a report callback may allocate).
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
    for (DebugHeap* d = head; d != nullptr; d = d->registry_next)
      for (const Header* h = d->live; h != nullptr; h = h->next) {
        ++sum.reported_blocks;
        sum.reported_bytes += h->user_size;
        add_to_group(&groups, &ungrouped, &ungrouped_bytes, h);
      }
  }
  unlock_live_lists(head, nullptr);
  background_resume();
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
  }
  if (sum.scanned && overflow) {
    TextWriter w(text, sizeof text);
    w.text("brisk: leaks: more mappings than the scan keeps; blocks in the rest were not scanned, so some listed "
           "blocks may be reachable through them\n");
    emit_report(text, w.finish());
  }
  if (why_all != nullptr && groups > 0) {
    TextWriter w(text, sizeof text);
    w.text("brisk: leaks: every live block is listed, reachable or not: ");
    w.text(why_all);
    w.put('\n');
    emit_report(text, w.finish());
  }
  if (summary != nullptr) *summary = sum;
  return groups;
}

}  // namespace brisk::debug
