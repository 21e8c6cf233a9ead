#include "debug/stack_trace.h"

#include <dlfcn.h>

#include <cstring>

#include "core/assert.h"
#include "core/hints.h"
#include "core/platform.h"
#include "core/text_writer.h"
#include "debug/frame_rule.h"

namespace brisk::debug {
namespace {

// libgcc's unwinder interface (unwind.h), declared here so that libbrisk.so does not link
// libgcc_s: it is looked up at run time and libbrisk.so keeps depending on libc only.
struct UnwindContext;
using UnwindTraceFn = int (*)(UnwindContext*, void*);
using UnwindBacktraceFn = int (*)(UnwindTraceFn, void*);
using UnwindGetIpInfoFn = std::uintptr_t (*)(UnwindContext*, int*);
using UnwindGetCfaFn = std::uintptr_t (*)(UnwindContext*);
using UnwindGetGrFn = std::uintptr_t (*)(UnwindContext*, int);
// libgcc's lookup of the FDE that covers an address (unwind-dw2-fde.h), and the bases it fills
// in: func is the start of the FDE's range.
struct EhBases {
  void* tbase;
  void* dbase;
  void* func;
};
using UnwindFindFdeFn = const void* (*)(void*, EhBases*);
constexpr int kUnwindNoReason = 0;
constexpr int kUnwindNormalStop = 4;

struct Unwinder {
  UnwindBacktraceFn backtrace;
  UnwindGetIpInfoFn get_ip_info;
  UnwindGetCfaFn get_cfa;
  UnwindGetGrFn get_gr;
  UnwindFindFdeFn find_fde;  // null: the cache learns nothing, every capture unwinds
};
// Written once by stack_trace_init, before any capture that uses it.
Unwinder g_unwinder{};
std::atomic<bool> g_have_unwinder{false};

// ---- The frame cache (x86-64) --------------------------------------------------------------
// The unwinder interprets each frame's DWARF call-frame program on every capture: 8 frames cost
// 3-17x a debug allocation without stacks. On x86-64 a return address is always stored at
// CFA - 8, and at a given return address a function's CFA is its stack pointer plus a constant
// (code built without frame pointers), its RBP plus 16 (with one: the caller's RBP is saved at
// RBP), or, in a frame GCC realigned through a register (DRAP: -mstackrealign, an over-aligned
// local beside alloca, libtbb's task dispatch), a word saved below its RBP. So the cache keeps,
// per return address the unwinder has walked through, that rule and where the caller's RBP is
// (unchanged, saved at CFA - 8k, or at RBP), read from the frame's call-frame information
// (debug/frame_rule.h) and checked against what the unwinder found; a later capture through the
// same return addresses walks the stack with a few loads per frame. A frame no such rule fits
// (a CFA in another register, signal frames and their trampolines, frames above 8 KiB) is
// marked uncached: a walk through it, or through a return address not seen yet, falls back to
// the unwinder, which teaches the cache.
#if defined(__x86_64__)
constexpr bool kFrameCache = true;
#else
constexpr bool kFrameCache = false;
#endif

// A slot: return address << kInfoBits | info; 0 when empty. Slots are written with
// compare-and-swap; an entry only ever gains kTerminal or kUncached, so any thread may read it.
// info: kTerminal | kUncached | kFramePointer | RBP's save slot k (0: unchanged) << kSlotShift
//       | (CFA - SP) / 8 (rsp-based frames), or with kFramePointer the DRAP slot j (CFA saved
//       at RBP - 8j; 0: CFA = RBP + 16).
constexpr unsigned kInfoBits = 17;
constexpr std::uint64_t kTerminal = 1u << 16;      // the unwinder found no caller above this frame
constexpr std::uint64_t kUncached = 1u << 15;      // no rule fits: walk with the unwinder
constexpr std::uint64_t kFramePointer = 1u << 14;  // CFA = RBP + 16 or *(RBP - 8j), the caller's RBP at RBP
constexpr unsigned kSlotShift = 10;
constexpr std::uint64_t kMaxSaveSlot = 15;
constexpr std::uint64_t kDeltaMask = (1u << kSlotShift) - 1;
constexpr std::uint64_t kRuleMask = kFramePointer | (kMaxSaveSlot << kSlotShift) | kDeltaMask;
constexpr std::size_t kCacheSlots = std::size_t{1} << 16;
constexpr std::size_t kCacheProbes = 8;
std::atomic<std::uint64_t>* g_frame_cache = nullptr;  // set by stack_trace_init
// This thread's captures (capture_counts): per thread, because every allocation in debug mode
// captures a stack, and one process-wide counter would be a cache line all of them write.
__thread std::uint64_t t_cached_captures __attribute__((tls_model("initial-exec"))) = 0;
__thread std::uint64_t t_unwound_captures __attribute__((tls_model("initial-exec"))) = 0;
__thread std::uint64_t t_replayed_captures __attribute__((tls_model("initial-exec"))) = 0;  // of the cached ones

// Counts the times an entry gained kTerminal or kUncached: a WalkMemo read at an older epoch
// may hold an entry without a flag it has since gained, and is not trusted. Starts at 1 (a
// memo's 0 is empty); only the first walks through new code change it.
std::atomic<std::uint64_t> g_cache_epoch{1};

std::size_t cache_slot(std::uintptr_t pc) { return static_cast<std::size_t>((pc * 0x9E3779B97F4A7C15ull) >> 48) & (kCacheSlots - 1); }

// The info of a return address, or 0 when it is not in the cache.
BRISK_ALWAYS_INLINE std::uint64_t cache_find(std::uintptr_t pc) {
  for (std::size_t i = 0, slot = cache_slot(pc); i < kCacheProbes; ++i, slot = (slot + 1) & (kCacheSlots - 1)) {
    const std::uint64_t entry = g_frame_cache[slot].load(std::memory_order_relaxed);
    if (entry == 0) return 0;
    if ((entry >> kInfoBits) == pc) return entry & ((std::uint64_t{1} << kInfoBits) - 1);
  }
  return 0;
}

// Records what a walk found for pc, merged with what is there: a second, different rule marks
// the return address uncached. A full probe run caches nothing.
void cache_learn(std::uintptr_t pc, std::uint64_t info) {
  if (pc == 0 || pc >= (std::uintptr_t{1} << (64 - kInfoBits))) return;
  if (info & kUncached) info &= kTerminal | kUncached;
  for (std::size_t i = 0, slot = cache_slot(pc); i < kCacheProbes; ++i, slot = (slot + 1) & (kCacheSlots - 1)) {
    std::uint64_t entry = g_frame_cache[slot].load(std::memory_order_relaxed);
    for (;;) {
      if (entry == 0) {
        if (g_frame_cache[slot].compare_exchange_weak(entry, (std::uint64_t{pc} << kInfoBits) | info, std::memory_order_relaxed))
          return;
        continue;  // entry reloaded: another thread took the slot
      }
      if ((entry >> kInfoBits) != pc) break;
      std::uint64_t merged = entry | (info & (kTerminal | kUncached));
      if (!(info & kUncached) && (entry & kRuleMask) != (info & kRuleMask)) merged |= kUncached;
      if (merged == entry) return;
      if (g_frame_cache[slot].compare_exchange_weak(entry, merged, std::memory_order_relaxed)) {
        // Release: a walk that reads the new epoch (acquire) then reads the entry with its flag.
        g_cache_epoch.fetch_add(1, std::memory_order_release);
        return;
      }
    }
  }
}

// A word of the calling thread's stack, in any frame: saved registers, return addresses, or
// (looking for a saved RBP) a caller's locals, which AddressSanitizer guards with redzones.
__attribute__((no_sanitize("address"))) std::uintptr_t load_word(std::uintptr_t address) {
  return *reinterpret_cast<const std::uintptr_t*>(address);
}

// The stack words a walk reads go through a Reader: word(address) for return addresses and
// DRAP slots, saved_rbp(address) for a caller's RBP, and use_rbp() where a frame-pointer frame
// uses the RBP the walk carries (the one it started with, or the last saved_rbp). A saved RBP
// that the walk loads and replaces before any frame uses it changes nothing the walk does: in
// code built without frame pointers RBP is an ordinary register (a loop counter, a pointer),
// and a replay that compared it would miss on every call.
struct PlainReader {
  std::uintptr_t word(std::uintptr_t address) { return load_word(address); }
  std::uintptr_t saved_rbp(std::uintptr_t address) { return load_word(address); }
  void use_rbp() {}
};

// A DRAP frame's CFA, loaded from its slot, lies above its RBP, within the realignment, and
// the prologue copied the return address at CFA - 8 to RBP + 8 (GCC's DRAP prologue pushes
// it there so that the frame also looks like a frame-pointer frame): a word that passes is that
// frame's CFA, not a stale slot.
template <class Reader>
bool drap_cfa_fits(std::uintptr_t cfa, std::uintptr_t rbp, Reader& read) {
  return cfa >= rbp + 16 && cfa - rbp <= kDeltaMask * 8 && cfa % 8 == 0 && read.word(cfa - 8) == read.word(rbp + 8);
}

// Walks the stack above a frame whose CFA is cfa and whose caller's RBP is rbp with the cache
// alone: the frame count, or -1 when a return address is missing or uncached, or a frame
// pointer leads nowhere sensible (the caller unwinds instead). lookup(pc, last) gives each
// return address's cache entry, in order, and is called for the last one too (last: its entry
// is not needed).
template <class Lookup, class Reader>
BRISK_ALWAYS_INLINE int walk(std::uintptr_t cfa, std::uintptr_t rbp, std::uintptr_t* frames, int max_depth, int skip,
                             Lookup&& lookup, Reader& read) {
  std::uintptr_t sp = cfa;
  std::uintptr_t pc = read.word(cfa - 8);
  int depth = 0;
  for (;;) {
    if (pc == 0) return depth;
    if (skip > 0) --skip;
    else frames[depth++] = pc;
    const std::uint64_t info = lookup(pc, depth == max_depth);
    if (depth == max_depth) return depth;
    if (info & kTerminal) return depth;
    if (info == 0 || (info & kUncached)) return -1;
    if (info & kFramePointer) {
      read.use_rbp();
      // The frame's own RBP, which the walk carried up: it must lie in this frame.
      if (rbp < sp || rbp - sp > kDeltaMask * 8 || rbp % 8 != 0) return -1;
      const std::uint64_t drap_slot = info & kDeltaMask;
      if (drap_slot == 0) {
        cfa = rbp + 16;
      } else {
        if (rbp - sp < 8 * drap_slot) return -1;
        cfa = read.word(rbp - 8 * drap_slot);
        if (!drap_cfa_fits(cfa, rbp, read)) return -1;
      }
      rbp = read.saved_rbp(rbp);
    } else {
      cfa = sp + (info & kDeltaMask) * 8;
      const std::uint64_t save_slot = (info >> kSlotShift) & kMaxSaveSlot;
      if (save_slot != 0) rbp = read.saved_rbp(cfa - 8 * save_slot);
    }
    pc = read.word(cfa - 8);
    sp = cfa;
  }
}

// Whether a capture from (cfa, rbp) through memo replays the memo's last walk. The memo keeps
// every word that walk loaded and where. A walk is a function of its start (CFA, and RBP when a
// frame-pointer frame uses it before a saved RBP is loaded), the cache entries of the return
// addresses it reads (unchanged while the epoch is), its depth and skip, and the words it loads,
// each address following from those before it. So when the start, the epoch and the arguments
// are the memo's and each recorded address still holds the recorded word, a walk would load
// the same words and find the same frames: a few loads and compares instead of a cache entry
// per frame (callgrind, a debug malloc/free pair with 8 frames: the compare about 50
// instructions, a whole replayed capture about 140, against 280 for the walk alone). The replay reads only what the walk would read: its first address is
// CFA - 8, and each later one follows from the start and the words before it, which compared
// equal. So a memo recorded on another thread (a debug heap passes on with its thread heap) can
// do no harm: it replays only if this thread's stack holds the same words at the same
// addresses. Inlined where a capture starts, ahead of walk_cached (most captures in a loop
// replay, and the call cost about a fifth of one).
BRISK_ALWAYS_INLINE bool replays(const WalkMemo* memo, std::uintptr_t cfa, std::uintptr_t rbp, int max_depth,
                                 int skip) {
  if (memo->replay_cfa != cfa || memo->max_depth != max_depth || memo->skip != skip ||
      (memo->replay_uses_rbp && memo->replay_rbp != rbp) ||
      memo->epoch != g_cache_epoch.load(std::memory_order_acquire))
    return false;
  const int loads = memo->loads;
  for (int i = 0; i < loads; ++i)
    if (load_word(memo->load_at[i]) != memo->loaded[i]) return false;
  return true;
}

// walk through the shared cache, or through a memo: entries come from the memo where its
// return address at the same level matches, the memo is rewritten with this walk's (and its
// words recorded for replays), and *same tells whether this walk read exactly the memo's return
// addresses (a walk is a function of the return addresses it reads, their entries and the stack
// words it loads, so its frames are then the memo's last frames). The memo's entries are the
// cache's as of its epoch.
int walk_cached(std::uintptr_t cfa, std::uintptr_t rbp, std::uintptr_t* frames, int max_depth, int skip,
                WalkMemo* memo, bool* same) {
  if (memo == nullptr) {
    PlainReader read;
    auto lookup = [](std::uintptr_t pc, bool last) { return last ? 0 : cache_find(pc); };
    return walk(cfa, rbp, frames, max_depth, skip, lookup, read);
  }
  const std::uint64_t epoch = g_cache_epoch.load(std::memory_order_acquire);
  const int recorded = memo->epoch == epoch ? memo->levels : 0;  // older entries may lack a flag
  bool matched = recorded > 0 && memo->max_depth == max_depth && memo->skip == skip;
  memo->epoch = epoch;
  memo->max_depth = max_depth;
  memo->skip = skip;
  memo->replay_cfa = 0;
  // Records the words the walk reads, a saved RBP only once a frame uses it.
  struct Recorder {
    WalkMemo* memo;
    int loads = 0;
    bool uses_start_rbp = false;
    bool rbp_saved = false;  // the walk's RBP is a saved one (else the one it started with)
    std::uintptr_t rbp_at = 0, rbp_word = 0;
    void add(std::uintptr_t address, std::uintptr_t word) {
      if (loads < WalkMemo::kLoads) {
        memo->load_at[loads] = address;
        memo->loaded[loads] = word;
      }
      ++loads;
    }
    std::uintptr_t word(std::uintptr_t address) {
      const std::uintptr_t w = load_word(address);
      add(address, w);
      return w;
    }
    std::uintptr_t saved_rbp(std::uintptr_t address) {
      rbp_saved = true;
      rbp_at = address;
      rbp_word = load_word(address);
      return rbp_word;
    }
    void use_rbp() {
      if (!rbp_saved) uses_start_rbp = true;
      else if (rbp_at != 0) add(rbp_at, rbp_word);
      rbp_at = 0;  // recorded once
    }
  } record{memo};
  int level = 0;
  const int depth = walk(
      cfa, rbp, frames, max_depth, skip,
      [&](std::uintptr_t pc, bool last) -> std::uint64_t {
        const int at = level++;
        if (at >= WalkMemo::kLevels) {
          matched = false;
          return last ? 0 : cache_find(pc);
        }
        if (at < recorded && memo->pc[at] == pc) {
          if (last) return 0;
          if (memo->info[at] != 0) return memo->info[at];
        } else {
          matched = false;
          memo->pc[at] = pc;
          memo->info[at] = 0;
          if (last) return 0;
        }
        return memo->info[at] = cache_find(pc);
      },
      record);
  *same = depth >= 0 && matched && level == recorded;
  memo->levels = depth >= 0 && level <= WalkMemo::kLevels ? level : 0;
  if (memo->levels != 0 && record.loads <= WalkMemo::kLoads) {
    memo->loads = record.loads;
    memo->depth = depth;
    memo->replay_rbp = rbp;
    memo->replay_uses_rbp = record.uses_start_rbp;
    memo->replay_cfa = cfa;
  }
  return depth;
}

struct CaptureState {
  std::uintptr_t* frames;
  int max_depth;
  int skip;  // frames still to skip, capture_stack's own included
  int depth;
  bool learn;
  bool stopped;        // on_frame ended the walk before the unwinder found the outermost frame
  // The previous frame's return address (0 before the first frame), stack pointer, RBP, and
  // whether it was a signal frame.
  std::uintptr_t last_pc;
  std::uintptr_t last_sp;
  std::uintptr_t last_rbp;
  bool last_signal;
};

// The cache's rule for a return address, from its frame's call-frame information: kUncached
// when the frame follows none of the rules walk_cached knows.
std::uint64_t cache_rule(const FrameRule& rule) {
  if (rule.signal_frame || rule.return_address != FrameRule::Saved::kAtCfa || rule.return_address_offset != -8)
    return kUncached;
  const std::int64_t max_offset = static_cast<std::int64_t>(kDeltaMask) * 8;
  switch (rule.cfa) {
    case FrameRule::Cfa::kRspOffset: {
      if (rule.cfa_offset <= 0 || rule.cfa_offset > max_offset || rule.cfa_offset % 8 != 0) return kUncached;
      const auto delta = static_cast<std::uint64_t>(rule.cfa_offset / 8);
      if (rule.rbp == FrameRule::Saved::kSame) return delta;
      const std::int64_t slot = -rule.rbp_offset / 8;
      if (rule.rbp == FrameRule::Saved::kAtCfa && rule.rbp_offset % 8 == 0 && slot >= 2 &&
          slot <= static_cast<std::int64_t>(kMaxSaveSlot) && 8 * slot <= rule.cfa_offset)
        return (static_cast<std::uint64_t>(slot) << kSlotShift) | delta;
      return kUncached;
    }
    case FrameRule::Cfa::kRbpOffset:
      return rule.cfa_offset == 16 && rule.rbp == FrameRule::Saved::kAtCfa && rule.rbp_offset == -16 ? kFramePointer
                                                                                                  : kUncached;
    case FrameRule::Cfa::kLoadRbp:
      if (rule.rbp == FrameRule::Saved::kAtRbp && rule.rbp_offset == 0 && rule.cfa_offset < 0 &&
          rule.cfa_offset % 8 == 0 && -rule.cfa_offset <= max_offset)
        return kFramePointer | static_cast<std::uint64_t>(-rule.cfa_offset / 8);
      return kUncached;
    default:
      return kUncached;
  }
}

std::uint64_t rule_from_call_frame_info(std::uintptr_t return_address) {
  if (g_unwinder.find_fde == nullptr) return kUncached;
  EhBases bases{};
  // The address of the call, as the unwinder looks it up: a call that ends its function has
  // a return address past the function's end.
  const void* fde = g_unwinder.find_fde(reinterpret_cast<void*>(return_address - 1), &bases);
  FrameRule rule;
  if (fde == nullptr || !read_frame_rule(fde, reinterpret_cast<std::uintptr_t>(bases.func), return_address, &rule))
    return kUncached;
  return cache_rule(rule);
}

// Whether a cached rule gives what the unwinder found for the same return address this time.
bool rule_holds(std::uint64_t info, std::uintptr_t sp, std::uintptr_t cfa, std::uintptr_t rbp, std::uintptr_t caller_rbp) {
  if (info & kFramePointer) {
    if (rbp < sp || rbp - sp > kDeltaMask * 8 || rbp % 8 != 0 || load_word(rbp) != caller_rbp) return false;
    const std::uint64_t drap_slot = info & kDeltaMask;
    if (drap_slot == 0) return rbp + 16 == cfa;
    PlainReader plain;
    return rbp - sp >= 8 * drap_slot && load_word(rbp - 8 * drap_slot) == cfa && drap_cfa_fits(cfa, rbp, plain);
  }
  if (sp + (info & kDeltaMask) * 8 != cfa) return false;
  const std::uint64_t save_slot = (info >> kSlotShift) & kMaxSaveSlot;
  return (save_slot != 0 ? load_word(cfa - 8 * save_slot) : rbp) == caller_rbp;
}

// What a frame teaches the cache about the frame before it (its callee, which ran from its own
// stack pointer up to its CFA). The unwinder's CFA of a frame is the CFA of the frame it
// called, which is its own stack pointer at that call.
void learn_frame(CaptureState* state, UnwindContext* context, std::uintptr_t pc, bool signal_frame) {
  const std::uintptr_t sp = g_unwinder.get_cfa(context);
  const std::uintptr_t rbp = g_unwinder.get_gr(context, 6);
  if (state->last_pc != 0) {
    // A signal frame's pc is no return address, and the frame before it (the trampoline)
    // finds its caller through the signal context, not at CFA - 8.
    if (signal_frame || state->last_signal) {
      cache_learn(state->last_pc, kUncached);
    } else {
      // A rule is cached only while it gives what the unwinder finds: a frame the call-frame
      // information describes wrongly, or that this reader misreads, stays with the unwinder.
      const std::uint64_t cached = cache_find(state->last_pc);
      if (cached == 0) {
        std::uint64_t rule = rule_from_call_frame_info(state->last_pc);
        if (!(rule & kUncached) && !rule_holds(rule, state->last_sp, sp, state->last_rbp, rbp)) rule = kUncached;
        cache_learn(state->last_pc, rule);
      } else if (!(cached & kUncached) && !rule_holds(cached, state->last_sp, sp, state->last_rbp, rbp)) {
        cache_learn(state->last_pc, kUncached);
      }
    }
  }
  state->last_pc = pc;
  state->last_sp = sp;
  state->last_rbp = rbp;
  state->last_signal = signal_frame;
}

int on_frame(UnwindContext* context, void* argument) {
  auto* state = static_cast<CaptureState*>(argument);
  int before_insn = 0;
  const std::uintptr_t pc = g_unwinder.get_ip_info(context, &before_insn);
  if (pc == 0) return kUnwindNormalStop;  // the frame before was the outermost
  if (state->learn) learn_frame(state, context, pc, before_insn != 0);
  if (state->skip > 0) {
    --state->skip;
    return kUnwindNoReason;
  }
  state->frames[state->depth++] = pc;
  if (state->depth == state->max_depth) {
    state->stopped = true;
    return kUnwindNormalStop;
  }
  return kUnwindNoReason;
}

// Inlined into both capture functions, so that skip counts their frame and no other.
BRISK_ALWAYS_INLINE int unwind(std::uintptr_t* frames, int max_depth, int skip, bool learn) {
  CaptureState state{frames, max_depth, skip, 0, learn, false, 0, 0, 0, false};
  g_unwinder.backtrace(on_frame, &state);
  // Unless the capture was full, the unwinder found no caller above the last frame (or a zero
  // return address): a cached walk stops there too.
  if (learn && !state.stopped && state.last_pc != 0) cache_learn(state.last_pc, kTerminal | kUncached);
  return state.depth;
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
  if (g_have_unwinder.load(std::memory_order_acquire)) return true;
  const char* const names[] = {"_Unwind_Backtrace", "_Unwind_GetIPInfo", "_Unwind_GetCFA", "_Unwind_GetGR"};
  void* found[4];
  auto find_all = [&](void* handle) {
    for (int i = 0; i < 4; ++i)
      if ((found[i] = dlsym(handle, names[i])) == nullptr) return false;
    return true;
  };
  // libgcc's own, even where another unwinder (libunwind, which perf links) defines the same
  // names first: the frame cache relies on libgcc's meaning of _Unwind_GetCFA. A C program
  // does not load libgcc_s by itself; the handle is kept for the process's life.
  void* libgcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libgcc == nullptr || !find_all(libgcc)) return false;
  if (kFrameCache && g_frame_cache == nullptr)
    g_frame_cache = static_cast<std::atomic<std::uint64_t>*>(platform::map(kCacheSlots * sizeof(std::uint64_t)));
  g_unwinder = Unwinder{reinterpret_cast<UnwindBacktraceFn>(found[0]), reinterpret_cast<UnwindGetIpInfoFn>(found[1]),
                        reinterpret_cast<UnwindGetCfaFn>(found[2]), reinterpret_cast<UnwindGetGrFn>(found[3]),
                        reinterpret_cast<UnwindFindFdeFn>(dlsym(libgcc, "_Unwind_Find_FDE"))};
  g_have_unwinder.store(true, std::memory_order_release);
  // The first unwind of a module reads its unwind tables; do it now, not inside an allocation.
  std::uintptr_t frames[4];
  capture_stack(frames, 4, 0);
  return true;
}

namespace {

// Inlined into both capture_stack functions, so that skip counts their frame and no other.
BRISK_ALWAYS_INLINE int capture_here(std::uintptr_t* frames, int max_depth, int skip, WalkMemo* memo, bool* same) {
  *same = false;
  if (!g_have_unwinder.load(std::memory_order_acquire) || max_depth <= 0) return 0;
  const bool cache = kFrameCache && g_frame_cache != nullptr;
  if (cache) {
    // The calling function keeps a frame pointer (__builtin_frame_address): its CFA is RBP +
    // 16, and its caller's RBP is saved at RBP.
    const auto fp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
    const std::uintptr_t cfa = fp + 16, rbp = load_word(fp);
    if (memo != nullptr && replays(memo, cfa, rbp, max_depth, skip)) {
      ++t_cached_captures;
      ++t_replayed_captures;
      *same = true;  // frames is left as it is (capture_stack)
      return memo->depth;
    }
    const int depth = walk_cached(cfa, rbp, frames, max_depth, skip, memo, same);
    if (depth >= 0) {
      ++t_cached_captures;
      return depth;
    }
    ++t_unwound_captures;
  }
  return unwind(frames, max_depth, skip + 1, cache);
}

}  // namespace

__attribute__((noinline)) int capture_stack(std::uintptr_t* frames, int max_depth, int skip) {
  bool same;
  return capture_here(frames, max_depth, skip, nullptr, &same);
}

__attribute__((noinline)) int capture_stack(std::uintptr_t* frames, int max_depth, int skip, WalkMemo* memo, bool* same) {
  return capture_here(frames, max_depth, skip, memo, same);
}

__attribute__((noinline)) int capture_stack_unwound(std::uintptr_t* frames, int max_depth, int skip) {
  if (!g_have_unwinder.load(std::memory_order_acquire) || max_depth <= 0) return 0;
  return unwind(frames, max_depth, skip + 1, false);
}

CaptureCounts capture_counts() {
  return {t_cached_captures, t_unwound_captures, t_replayed_captures};
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
      // Acquire, with the release count after each publication: a count seen full shows every
      // publication that made it so, such as one into this very slot.
      if (stored_.load(std::memory_order_acquire) >= max_stacks_) {
        // Full, or made full just now by a store that published into this very slot: that
        // store may have been this stack's (two threads storing it at once), which is not lost.
        id = table_[slot].load(std::memory_order_acquire);
        if (id != kNoStack) {
          if (same(id)) return id;
          continue;  // another stack took the slot: probe on
        }
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
      stored_.fetch_add(1, std::memory_order_release);
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
