// The DebugMode fixture of the debug-mode tests (debug_mode_test.cc, debug_realloc_test.cc):
// debug mode on, reports collected by a callback, BRISK_DEBUG_ACTION "report" (set_keep_going),
// so a problem is seen as a report text rather than an abort.
#pragma once

#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "core/options.h"
#include "debug/block.h"

inline std::mutex g_reports_mutex;
inline std::string g_reports;
inline int g_report_count = 0;

inline void CollectReport(const char* text, size_t length, void*) {
  std::lock_guard<std::mutex> g(g_reports_mutex);
  g_reports.append(text, length);
  ++g_report_count;
}

// The fill limit debug::init() read (BRISK_DEBUG_FILL_LIMIT, or its default): tests that set
// another put this back.
inline size_t DefaultFillLimit() { return static_cast<size_t>(brisk::options::get(brisk::options::Id::kDebugFillLimit)); }

// Enters debug mode with reports collected, and leaves it (and checks the heap) at the end.
class DebugMode : public testing::Test {
 protected:
  void SetUp() override {
    brisk_debug_enter();
    brisk::debug::set_keep_going(true);
    brisk_debug_set_report_callback(CollectReport, nullptr);
    std::lock_guard<std::mutex> g(g_reports_mutex);
    g_reports.clear();
    g_report_count = 0;
  }
  void TearDown() override {
    while (brisk_debug_active()) brisk_debug_exit();
    brisk_debug_set_report_callback(nullptr, nullptr);
  }
  static std::string Reports() {
    std::lock_guard<std::mutex> g(g_reports_mutex);
    return g_reports;
  }
  static int ReportCount() {
    std::lock_guard<std::mutex> g(g_reports_mutex);
    return g_report_count;
  }
};
