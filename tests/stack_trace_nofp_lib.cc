// A shared object built without frame pointers (-fomit-frame-pointer, see tests/CMakeLists.txt)
// for stack_trace_test: a capture made through it must still unwind to its caller.
#include <cstdint>

using CaptureFn = int (*)(std::uintptr_t* frames, int max_depth, int skip);

// Calls capture through the pointer (so the capture runs in the test's copy of brisk) and reports
// its own return address, the call site in its caller.
extern "C" __attribute__((noinline, visibility("default"))) int nofp_capture(CaptureFn capture, std::uintptr_t* frames,
                                                                           int max_depth, std::uintptr_t* return_address) {
  *return_address = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
  const int depth = capture(frames, max_depth, 0);
  // Keeps the call above from becoming a tail call, which would take this frame off the stack.
  asm volatile("" ::: "memory");
  return depth;
}
