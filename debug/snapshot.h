// Snapshots: a report's inputs (debug/report.h), copied from a block's header and bytes while
// the block cannot change (under its debug heap's live_lock), so that the report, which may
// allocate or call the program's callback, runs after the lock is dropped. Internal to debug/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "debug/block_layout.h"
#include "debug/fill_check.h"
#include "debug/report.h"

namespace brisk::debug {

struct Snapshot {
  const char* problem = nullptr;
  const void* user = nullptr;
  std::size_t user_size = 0;
  std::uint32_t alloc_thread = 0, free_thread = 0, alloc_stack = 0, free_stack = 0;
  bool has_damage = false;
  FillDamage damage;
  std::size_t dump_size = 0;
  std::uint8_t dump[kDumpBytes];
};

// damage: the ranges found, or nullptr.
void take_snapshot(Snapshot* s, const char* problem, const Header* h, const FillDamage* damage);
// Reports s (symbolising its stacks).
void emit(const Snapshot& s);
// Reports and, unless BRISK_DEBUG_ACTION=report, aborts.
void problem_found(const Snapshot& s);
// A problem at p that no header describes (a pointer that is no debug block).
void problem_at(const char* problem, const void* p);

// BRISK_DEBUG_ACTION=report: go on after a report (block.cc's init and set_keep_going set it).
extern std::atomic<bool> g_keep_going;

}  // namespace brisk::debug
