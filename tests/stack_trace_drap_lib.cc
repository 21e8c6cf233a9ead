// A shared object whose frame GCC realigns through a register (DRAP), for stack_trace_test: an
// over-aligned local beside a variable-size alloca makes GCC copy the incoming stack pointer to
// R10, realign RSP, and describe the CFA as a word saved below RBP (DW_CFA_def_cfa_expression
// DW_OP_breg6 -N; DW_OP_deref), the rule libtbb's task dispatch frames have. Built without
// sanitizers (tests/CMakeLists.txt), which would move the locals elsewhere.
#include <cstddef>
#include <cstdint>

using CaptureFn = int (*)(std::uintptr_t* frames, int max_depth, int skip);

// Calls capture through the pointer from a realigned frame whose size is bytes plus the
// realignment, and reports its own return address, the call site in its caller.
extern "C" __attribute__((noinline, visibility("default"))) int drap_capture(CaptureFn capture, std::uintptr_t* frames,
                                                                           int max_depth, std::size_t bytes,
                                                                           std::uintptr_t* return_address) {
  alignas(64) char aligned[64];
  char* sized = static_cast<char*>(__builtin_alloca(bytes));
  asm volatile("" : : "r"(aligned), "r"(sized) : "memory");
  *return_address = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
  const int depth = capture(frames, max_depth, 0);
  // Keeps the call above from becoming a tail call, which would take this frame off the stack.
  asm volatile("" ::: "memory");
  return depth;
}
