// Debug-mode reports: one text per problem found in a debug block, formatted without malloc into
// a fixed buffer, and sent to one sink.
//
// Interface for the debug layer's integration:
//   BlockReport                         what a report says: the problem, block, user size, the
//                                       damage (debug/fill_check.h), the allocating and freeing
//                                       threads with their stacks, and the bytes to dump.
//   format_report(report, out, cap)     the text (below); returns its length, truncated to cap-1
//                                       with a closing "(report truncated)" line, NUL-terminated.
//   report_problem(report)              formats into a stack buffer of kReportCapacity and emits.
//   emit_report(text, length)           to the callback if one is set, else to the file named by
//                                       BRISK_DEBUG_LOG (opened for appending on first use), else
//                                       to stderr (also when the file cannot be opened).
//   set_report_callback(fn, context)    the future brisk_debug_set_report_callback; nullptr
//                                       restores the file/stderr sink.
//
// The text, every line ending in '\n' (a damaged-range line and the stack sections only when
// there is something to say; "freed by" only for a freed block):
//   brisk: PROBLEM
//     block 0xADDR, user size N
//     damaged ranges: OFF(LEN) OFF(LEN) ... [and more]
//     allocated by thread T:
//       #0 FRAME                            FRAME: format_frame (debug/stack_trace.h)
//       (no stack recorded)                 when the stack has no frames
//     freed by thread T:
//       ...
//     first N bytes:
//       0000  a5 a5 a5 a5 a5 a5 a5 a5  a5 a5 a5 a5 a5 a5 a5 a5  |................|
//       (16 bytes a line, at most the first kDumpBytes; the last line padded)
//
// Thread-safe: format_report uses only its arguments; emit_report may be called from any thread
// (each report goes to the sink in one call: one callback call, or one write loop).
#pragma once

#include <cstddef>
#include <cstdint>

#include "debug/fill_check.h"

namespace brisk::debug {

inline constexpr std::size_t kDumpBytes = 256;
inline constexpr std::size_t kReportCapacity = 16384;

// Formats one frame into out (NUL-terminated), returning its length; format_frame by default.
using FrameFormatter = std::size_t (*)(std::uintptr_t pc, char* out, std::size_t capacity);

struct ReportStack {
  std::uint64_t thread = 0;                // 0: no such event (a live block has no freeing thread)
  const std::uintptr_t* frames = nullptr;  // innermost first
  int depth = 0;
};

struct BlockReport {
  const char* problem = "";                // e.g. "write after free", "overrun", "double free"
  const void* block = nullptr;             // the user pointer
  std::size_t user_size = 0;
  const FillDamage* damage = nullptr;      // offsets relative to the block; nullptr: none to list
  ReportStack allocated;
  ReportStack freed;
  const void* dump = nullptr;              // bytes to dump (usually the block); nullptr: no dump
  std::size_t dump_size = 0;               // at most kDumpBytes of them are shown
  FrameFormatter format_frame = nullptr;   // nullptr: debug::format_frame
};

std::size_t format_report(const BlockReport& report, char* out, std::size_t capacity);
void report_problem(const BlockReport& report);
void emit_report(const char* text, std::size_t length);

using ReportCallback = void (*)(const char* text, std::size_t length, void* context);
void set_report_callback(ReportCallback callback, void* context);

// fork: the sink's lock, released in the parent, reset in the child.
void report_sink_lock();
void report_sink_unlock();
void report_sink_reset_in_child();

}  // namespace brisk::debug
