// A debug block's header, and the debug layer's state shared by the files that read headers
// (block.cc: blocks; leaks.cc: the leak report). Internal to debug/; the layout is drawn in the
// README ("Debug mode").
#pragma once

#include <atomic>
#include <cstdint>

#include "debug/block.h"
#include "debug/stack_trace.h"

namespace brisk::debug {

struct DebugHeap;

enum class State : std::uint8_t { kLive = 1, kQuarantined = 2, kKept = 3 };

struct Header {
  std::uint64_t check;  // kMagic ^ user address while live, quarantined or kept; else 0
  Header* prev;         // heap's live list, under its live_lock
  Header* next;
  DebugHeap* heap;      // the debug heap that made the block; its live_lock guards state
  char* underlying;     // the block this one is carved from
  std::uint64_t user_size;
  std::uint64_t sequence;
  std::uint32_t alloc_thread;
  std::uint32_t free_thread;  // 0 while live
  std::uint32_t alloc_stack;
  std::uint32_t free_stack;
  Kind kind;
  State state;
  bool edges_only;  // patterns on the first and last kFillEdgeBytes only (the fill limit)
  std::uint8_t reserved;
  std::uint32_t checksum;  // over every field but check, prev, next and itself
  std::uint8_t guard[kGuardBytes];
};
// Every captured stack, stored once (block.cc's capture).
extern StackDepot g_depot;
// debug::init's progress: 0 not started, 1 running, 2 done.
extern std::atomic<int> g_init_state;

}  // namespace brisk::debug
