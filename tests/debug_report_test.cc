// debug/report: the exact text of reports, truncation into a small buffer, and the three sinks
// (callback, BRISK_DEBUG_LOG file, stderr).
#include "debug/report.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "debug/stack_trace.h"

namespace {

using brisk::debug::BlockReport;
using brisk::debug::FillDamage;

// Frames in tests are fake addresses: name them deterministically.
std::size_t FakeFrame(std::uintptr_t pc, char* out, std::size_t capacity) {
  return static_cast<std::size_t>(std::snprintf(out, capacity, "libapp.so+0x%zx (fn%zu)", static_cast<std::size_t>(pc - 1),
                                                static_cast<std::size_t>(pc % 7)));
}

std::string Format(const BlockReport& report, std::size_t capacity = brisk::debug::kReportCapacity) {
  std::string text(capacity, '\0');
  const std::size_t n = brisk::debug::format_report(report, text.data(), capacity);
  EXPECT_EQ(text[n], '\0');
  text.resize(n);
  return text;
}

TEST(DebugReport, AWriteAfterFreeNamesEverything) {
  unsigned char block[40];
  std::memset(block, 0xA5, sizeof block);
  std::memcpy(block + 3, "Hi", 2);
  block[20] = 0x00;
  FillDamage damage{};
  damage.first_offset = 3;
  damage.range_count = 2;
  damage.ranges[0] = {3, 2};
  damage.ranges[1] = {20, 1};
  const std::uintptr_t alloc_frames[] = {0x1001, 0x2002};
  const std::uintptr_t free_frames[] = {0x3003};
  BlockReport report;
  report.problem = "write after free";
  report.block = reinterpret_cast<void*>(0x7f0012345670);
  report.user_size = 40;
  report.damage = &damage;
  report.allocated = {7, alloc_frames, 2};
  report.freed = {9, free_frames, 1};
  report.dump = block;
  report.dump_size = sizeof block;
  report.format_frame = FakeFrame;
  EXPECT_EQ(Format(report),
            "brisk: write after free\n"
            "  block 0x7f0012345670, user size 40\n"
            "  damaged ranges: 3(2) 20(1)\n"
            "  allocated by thread 7:\n"
            "    #0 libapp.so+0x1000 (fn2)\n"
            "    #1 libapp.so+0x2001 (fn4)\n"
            "  freed by thread 9:\n"
            "    #0 libapp.so+0x3002 (fn6)\n"
            "  first 40 bytes:\n"
            "    0000  a5 a5 a5 48 69 a5 a5 a5  a5 a5 a5 a5 a5 a5 a5 a5  |...Hi...........|\n"
            "    0010  a5 a5 a5 a5 00 a5 a5 a5  a5 a5 a5 a5 a5 a5 a5 a5  |................|\n"
            "    0020  a5 a5 a5 a5 a5 a5 a5 a5                           |........|\n");
}

TEST(DebugReport, ALiveBlockWithoutStacksOrDamageHasNoSuchSections) {
  unsigned char byte = 'x';
  BlockReport report;
  report.problem = "overrun";
  report.block = reinterpret_cast<void*>(0x1000);
  report.user_size = 1;
  report.allocated = {3, nullptr, 0};
  report.dump = &byte;
  report.dump_size = 1;
  EXPECT_EQ(Format(report),
            "brisk: overrun\n"
            "  block 0x1000, user size 1\n"
            "  allocated by thread 3:\n"
            "    (no stack recorded)\n"
            "  first 1 byte:\n"
            "    0000  78                                                |x|\n");
}

TEST(DebugReport, TheDumpStopsAt256BytesAndMoreRangesAreSaid) {
  unsigned char block[1000];
  std::memset(block, 0, sizeof block);
  FillDamage damage{};
  damage.range_count = brisk::debug::kMaxDamagedRanges;
  for (int i = 0; i < damage.range_count; ++i) damage.ranges[i] = {static_cast<std::size_t>(2 * i), 1};
  damage.more_ranges = true;
  BlockReport report;
  report.problem = "write after free";
  report.block = block;
  report.user_size = sizeof block;
  report.damage = &damage;
  report.dump = block;
  report.dump_size = sizeof block;
  const std::string text = Format(report);
  EXPECT_NE(text.find(" 60(1) 62(1) and more\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  first 256 bytes:\n"), std::string::npos);
  EXPECT_NE(text.find("    00f0  00"), std::string::npos);
  EXPECT_EQ(text.find("    0100  "), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(DebugReport, ATooSmallBufferEndsWithATruncationLine) {
  unsigned char block[256] = {};
  BlockReport report;
  report.problem = "write after free";
  report.block = block;
  report.user_size = sizeof block;
  report.dump = block;
  report.dump_size = sizeof block;
  const std::string full = Format(report);
  const std::string cut = Format(report, 200);
  EXPECT_EQ(cut.size(), 199u);
  EXPECT_EQ(cut.substr(0, 150), full.substr(0, 150));
  const std::string marker = "\n(report truncated)\n";
  EXPECT_EQ(cut.substr(cut.size() - marker.size()), marker);
}

// With the real formatter, each frame is module+0xoffset of the return address minus one, plus
// the symbol when dladdr knows it.
TEST(DebugReport, RealFramesAreModulePlusOffsetWithTheSymbol) {
  const auto pc = reinterpret_cast<std::uintptr_t>(&brisk::debug::format_report) + 0x11;
  char frame[512];
  const std::size_t n = brisk::debug::format_frame(pc, frame, sizeof frame);
  const std::string text(frame, n);
  EXPECT_NE(text.find("+0x"), std::string::npos) << text;
  EXPECT_NE(text.find("debug_report_test"), std::string::npos) << text;  // the module: this program
  EXPECT_EQ(brisk::debug::format_frame(pc, frame, 8), 7u);                // fits any buffer
}

struct Captured {
  std::string text;
  int calls = 0;
};

void Capture(const char* text, std::size_t length, void* context) {
  auto* captured = static_cast<Captured*>(context);
  captured->text.assign(text, length);
  ++captured->calls;
}

BlockReport Simple(const char* problem) {
  BlockReport report;
  report.problem = problem;
  report.block = reinterpret_cast<void*>(0x10);
  report.user_size = 4;
  return report;
}

TEST(DebugReport, TheCallbackReceivesTheWholeReportAndNullRestoresTheDefault) {
  Captured captured;
  brisk::debug::set_report_callback(Capture, &captured);
  brisk::debug::report_problem(Simple("double free"));
  brisk::debug::set_report_callback(nullptr, nullptr);
  EXPECT_EQ(captured.calls, 1);
  EXPECT_EQ(captured.text, "brisk: double free\n  block 0x10, user size 4\n");
  testing::internal::CaptureStderr();
  brisk::debug::report_problem(Simple("invalid pointer"));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "brisk: invalid pointer\n  block 0x10, user size 4\n");
  EXPECT_EQ(captured.calls, 1);
}

// Run last in this program: the log file is chosen at the first report without a callback, so
// this test runs in its own process (gtest_filter in CMake) with BRISK_DEBUG_LOG set.
TEST(DebugReportLog, ReportsAreAppendedToTheLogFile) {
  const char* path = getenv("BRISK_DEBUG_LOG");
  if (path == nullptr) GTEST_SKIP() << "run with BRISK_DEBUG_LOG set (ctest does)";
  unlink(path);
  testing::internal::CaptureStderr();
  brisk::debug::report_problem(Simple("overrun"));
  brisk::debug::report_problem(Simple("underrun"));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "brisk: overrun\n  block 0x10, user size 4\nbrisk: underrun\n  block 0x10, user size 4\n");
  unlink(path);
}

}  // namespace
