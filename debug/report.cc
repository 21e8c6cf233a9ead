#include "debug/report.h"

#include <atomic>

#include "core/lock.h"
#include "core/platform.h"
#include "debug/stack_trace.h"
#include "core/text_writer.h"

namespace brisk::debug {
namespace {

void write_stack(TextWriter& w, const char* event, const ReportStack& stack, FrameFormatter format) {
  w.text("  ");
  w.text(event);
  w.text(" by thread ");
  w.decimal(stack.thread);
  w.text(":\n");
  if (stack.depth <= 0) w.text("    (no stack recorded)\n");
  for (int i = 0; i < stack.depth; ++i) {
    w.text("    #");
    w.decimal(static_cast<std::uint64_t>(i));
    w.put(' ');
    char frame[512];
    const std::size_t n = format(stack.frames[i], frame, sizeof frame);
    w.text(frame, n);
    w.put('\n');
  }
}

void write_dump(TextWriter& w, const std::uint8_t* bytes, std::size_t size) {
  if (size > kDumpBytes) size = kDumpBytes;
  w.text("  first ");
  w.decimal(size);
  w.text(size == 1 ? " byte:\n" : " bytes:\n");
  for (std::size_t line = 0; line < size; line += 16) {
    w.text("    ");
    w.hex(line, 4);
    for (std::size_t i = line; i < line + 16; ++i) {
      w.text(i % 8 == 0 ? "  " : " ");
      if (i < size) {
        w.hex(bytes[i], 2);
      } else {
        w.text("  ");
      }
    }
    w.text("  |");
    for (std::size_t i = line; i < line + 16 && i < size; ++i) w.put(bytes[i] >= 0x20 && bytes[i] < 0x7f ? static_cast<char>(bytes[i]) : '.');
    w.text("|\n");
  }
}

// The sink. The callback and its context are read as one pair under the lock, so a report is
// never given to one callback with another's context; the log file is opened once.
SpinLock g_sink_lock;
ReportCallback g_callback = nullptr;
void* g_callback_context = nullptr;
int g_log_fd = -2;  // -2: BRISK_DEBUG_LOG not looked at yet; -1: none (stderr)

}  // namespace

std::size_t format_report(const BlockReport& report, char* out, std::size_t capacity) {
  TextWriter w(out, capacity);
  const FrameFormatter format = report.format_frame != nullptr ? report.format_frame : format_frame;
  w.text("brisk: ");
  w.text(report.problem);
  w.text("\n  block 0x");
  w.hex(reinterpret_cast<std::uintptr_t>(report.block), 1);
  w.text(", user size ");
  w.decimal(report.user_size);
  w.put('\n');
  if (report.damage != nullptr && report.damage->range_count > 0) {
    w.text("  damaged ranges:");
    for (int i = 0; i < report.damage->range_count; ++i) {
      w.put(' ');
      w.decimal(report.damage->ranges[i].offset);
      w.put('(');
      w.decimal(report.damage->ranges[i].length);
      w.put(')');
    }
    if (report.damage->more_ranges) w.text(" and more");
    w.put('\n');
  }
  if (report.allocated.thread != 0) write_stack(w, "allocated", report.allocated, format);
  if (report.freed.thread != 0) write_stack(w, "freed", report.freed, format);
  if (report.dump != nullptr && report.dump_size > 0)
    write_dump(w, static_cast<const std::uint8_t*>(report.dump), report.dump_size);
  return w.finish("\n(report truncated)\n");
}

void report_problem(const BlockReport& report) {
  char text[kReportCapacity];
  emit_report(text, format_report(report, text, sizeof text));
}

void emit_report(const char* text, std::size_t length) {
  ReportCallback callback;
  void* context;
  int fd;
  {
    LockGuard guard(g_sink_lock);
    callback = g_callback;
    context = g_callback_context;
    if (callback == nullptr && g_log_fd == -2) {
      const char* path = platform::get_env("BRISK_DEBUG_LOG");
      g_log_fd = path != nullptr && path[0] != '\0' ? platform::open_log_file(path) : -1;
    }
    fd = g_log_fd;
  }
  // Outside the lock: a callback may allocate, and so reach the debug layer and report again.
  if (callback != nullptr) {
    callback(text, length, context);
  } else if (fd >= 0) {
    platform::write_fd(fd, text, length);
  } else {
    platform::write_stderr(text, length);
  }
}

void set_report_callback(ReportCallback callback, void* context) {
  LockGuard guard(g_sink_lock);
  g_callback = callback;
  g_callback_context = context;
}

void report_sink_lock() { g_sink_lock.lock(); }
void report_sink_unlock() { g_sink_lock.unlock(); }
void report_sink_reset_in_child() { g_sink_lock.reset_after_fork(); }

}  // namespace brisk::debug
