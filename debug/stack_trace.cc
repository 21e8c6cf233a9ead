#include "debug/stack_trace.h"

#include <dlfcn.h>

#include <cstring>

#include "core/assert.h"
#include "core/platform.h"
#include "core/text_writer.h"

namespace brisk::debug {
namespace {

// libgcc's unwinder interface (unwind.h), declared here so that libbrisk.so does not link
// libgcc_s: it is looked up at run time and libbrisk.so keeps depending on libc only.
struct UnwindContext;
using UnwindTraceFn = int (*)(UnwindContext*, void*);
using UnwindBacktraceFn = int (*)(UnwindTraceFn, void*);
using UnwindGetIpFn = std::uintptr_t (*)(UnwindContext*);
constexpr int kUnwindNoReason = 0;
constexpr int kUnwindNormalStop = 4;

// Written once by stack_trace_init, before any capture that uses them (relaxed: a capture that
// races with init sees either nothing or both, as the pair is published by backtrace last).
std::atomic<UnwindGetIpFn> g_get_ip{nullptr};
std::atomic<UnwindBacktraceFn> g_backtrace{nullptr};

struct CaptureState {
  std::uintptr_t* frames;
  int max_depth;
  int skip;  // frames still to skip, capture_stack's own included
  int depth;
  UnwindGetIpFn get_ip;
};

int on_frame(UnwindContext* context, void* argument) {
  auto* state = static_cast<CaptureState*>(argument);
  const std::uintptr_t pc = state->get_ip(context);
  if (pc == 0) return kUnwindNormalStop;
  if (state->skip > 0) {
    --state->skip;
    return kUnwindNoReason;
  }
  state->frames[state->depth++] = pc;
  return state->depth == state->max_depth ? kUnwindNormalStop : kUnwindNoReason;
}

std::uint32_t hash_frames(const std::uintptr_t* frames, int depth) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(depth);
  for (int i = 0; i < depth; ++i) {
    h ^= frames[i];
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

}  // namespace

bool stack_trace_init() {
  if (g_backtrace.load(std::memory_order_acquire) != nullptr) return true;
  void* backtrace = dlsym(RTLD_DEFAULT, "_Unwind_Backtrace");
  void* get_ip = dlsym(RTLD_DEFAULT, "_Unwind_GetIP");
  if (backtrace == nullptr || get_ip == nullptr) {
    // A C program does not load libgcc_s by itself; the handle is kept for the process's life.
    void* libgcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libgcc == nullptr) return false;
    backtrace = dlsym(libgcc, "_Unwind_Backtrace");
    get_ip = dlsym(libgcc, "_Unwind_GetIP");
    if (backtrace == nullptr || get_ip == nullptr) return false;
  }
  g_get_ip.store(reinterpret_cast<UnwindGetIpFn>(get_ip), std::memory_order_relaxed);
  g_backtrace.store(reinterpret_cast<UnwindBacktraceFn>(backtrace), std::memory_order_release);
  // The first unwind of a module reads its unwind tables; do it now, not inside an allocation.
  std::uintptr_t frames[4];
  capture_stack(frames, 4, 0);
  return true;
}

__attribute__((noinline)) int capture_stack(std::uintptr_t* frames, int max_depth, int skip) {
  const UnwindBacktraceFn backtrace = g_backtrace.load(std::memory_order_acquire);
  if (backtrace == nullptr || max_depth <= 0) return 0;
  CaptureState state{frames, max_depth, skip + 1, 0, g_get_ip.load(std::memory_order_relaxed)};
  backtrace(on_frame, &state);
  return state.depth;
}

std::size_t format_frame(std::uintptr_t pc, char* out, std::size_t capacity) {
  TextWriter w(out, capacity);
  const std::uintptr_t call = pc - 1;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(call), &info) != 0 && info.dli_fname != nullptr) {
    w.text(info.dli_fname[0] != '\0' ? info.dli_fname : "?");
    w.text("+0x");
    w.hex(call - reinterpret_cast<std::uintptr_t>(info.dli_fbase), 1);
    if (info.dli_sname != nullptr) {
      w.text(" (");
      w.text(info.dli_sname);
      w.text("+0x");
      w.hex(call - reinterpret_cast<std::uintptr_t>(info.dli_saddr), 1);
      w.put(')');
    }
  } else {
    w.text("0x");
    w.hex(call, 1);
  }
  return w.finish();
}

bool StackDepot::init(std::uint32_t max_stacks, std::size_t arena_bytes) {
  BRISK_ASSERT(table_ == nullptr);
  // At most half the slots are ever used, so every probe sequence ends at an empty slot.
  std::size_t slots = 2;
  while (slots < 2 * static_cast<std::size_t>(max_stacks)) slots *= 2;
  const std::size_t page = 4096;
  table_bytes_ = (slots * sizeof(std::atomic<std::uint32_t>) + page - 1) / page * page;
  arena_bytes_ = (arena_bytes + page - 1) / page * page;
  // Ids are 8-byte word offsets in 32 bits.
  if (arena_bytes_ / 8 >= UINT32_MAX) arena_bytes_ = (std::size_t{UINT32_MAX} - 1) * 8 / page * page;
  void* table = platform::map(table_bytes_);
  void* arena = platform::map(arena_bytes_);
  if (table == nullptr || arena == nullptr) {
    if (table != nullptr) platform::unmap(table, table_bytes_);
    if (arena != nullptr) platform::unmap(arena, arena_bytes_);
    table_bytes_ = arena_bytes_ = 0;
    return false;
  }
  // Fresh mappings are zero: every slot starts empty.
  table_ = static_cast<std::atomic<std::uint32_t>*>(table);
  arena_ = static_cast<std::uint8_t*>(arena);
  slot_mask_ = slots - 1;
  max_stacks_ = max_stacks;
  return true;
}

const StackDepot::Record* StackDepot::record(std::uint32_t id) const {
  return reinterpret_cast<const Record*>(arena_ + (static_cast<std::size_t>(id) - 1) * 8);
}

std::uint32_t StackDepot::store(const std::uintptr_t* frames, int depth) {
  if (depth <= 0 || table_ == nullptr) return kNoStack;
  if (depth > kMaxStackDepth) depth = kMaxStackDepth;
  const std::uint32_t hash = hash_frames(frames, depth);
  const std::size_t frame_bytes = static_cast<std::size_t>(depth) * sizeof(std::uintptr_t);
  auto same = [&](std::uint32_t id) {
    const Record* r = record(id);
    return r->hash == hash && r->depth == static_cast<std::uint32_t>(depth) && std::memcmp(r->frames, frames, frame_bytes) == 0;
  };
  std::uint32_t fresh = kNoStack;  // a record written but not yet published
  // At most one pass over the table: racing publishers can fill it past max_stacks_ when it is
  // tiny, and a probe must still end.
  std::size_t probes = 0;
  for (std::size_t slot = hash & slot_mask_;; slot = (slot + 1) & slot_mask_) {
    if (probes++ > slot_mask_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return kNoStack;
    }
    std::uint32_t id = table_[slot].load(std::memory_order_acquire);
    if (id != kNoStack) {
      if (same(id)) return id;  // a record written by another thread first is wasted arena
      continue;
    }
    if (fresh == kNoStack) {
      // The arena bounds the depot's memory; the count of published stacks bounds the table's
      // load. Only published stacks count: two threads racing to store the same new stack
      // must not make a third one's different stack look like overflow. Racing publishers can
      // pass max_stacks_ by fewer than the number of threads; the table has twice max_stacks_
      // slots, and a probe that finds it full anyway drops the stack (above).
      if (stored_.load(std::memory_order_relaxed) >= max_stacks_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return kNoStack;
      }
      const std::size_t bytes = sizeof(Record) + frame_bytes;
      const std::size_t offset = arena_used_.fetch_add(bytes, std::memory_order_relaxed);
      if (offset + bytes > arena_bytes_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return kNoStack;
      }
      auto* r = reinterpret_cast<Record*>(arena_ + offset);
      r->hash = hash;
      r->depth = static_cast<std::uint32_t>(depth);
      std::memcpy(r->frames, frames, frame_bytes);
      fresh = static_cast<std::uint32_t>(offset / 8 + 1);
    }
    // Release publishes the record's contents with its id.
    if (table_[slot].compare_exchange_strong(id, fresh, std::memory_order_release, std::memory_order_acquire)) {
      stored_.fetch_add(1, std::memory_order_relaxed);
      return fresh;
    }
    if (same(id)) return id;
  }
}

int StackDepot::fetch(std::uint32_t id, const std::uintptr_t** frames) const {
  if (id == kNoStack || table_ == nullptr) return 0;
  const Record* r = record(id);
  *frames = r->frames;
  return static_cast<int>(r->depth);
}

}  // namespace brisk::debug
