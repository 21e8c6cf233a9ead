// How to find a frame's caller on x86-64, read from the DWARF call-frame information (CFI) of
// .eh_frame: for stack_trace.cc's frame cache, which learns each return address's rule here
// instead of guessing it from the values one walk saw.
//
//   read_frame_rule(fde, function_start, return_address)
//       runs the CIE's and the FDE's call-frame programs up to the return address, as libgcc's
//       unwinder does (rows whose location is below the return address), and keeps the three
//       rules a walk needs: the CFA, the caller's RBP and the return address. No malloc, no lock.
//
// Only what GCC and clang emit for x86-64 is understood; anything else (DW_CFA_set_loc,
// 64-bit DWARF, CIE version 4, an expression other than the two below) gives kUnknown, which
// the cache treats as "walk this frame with the unwinder".
#pragma once

#include <cstdint>

namespace brisk::debug {

struct FrameRule {
  enum class Cfa : std::uint8_t {
    kUnknown,
    kRspOffset,  // CFA = RSP + cfa_offset
    kRbpOffset,  // CFA = RBP + cfa_offset
    kLoadRbp,    // CFA = *(RBP + cfa_offset): GCC's DRAP (DW_OP_breg6 cfa_offset; DW_OP_deref)
  };
  enum class Saved : std::uint8_t {
    kUnknown,
    kSame,       // the caller's value is this frame's (never saved, or DW_CFA_same_value)
    kAtCfa,      // saved at CFA + offset (DW_CFA_offset)
    kAtRbp,      // saved at RBP + offset (DW_CFA_expression DW_OP_breg6 offset): DRAP frames
  };
  Cfa cfa = Cfa::kUnknown;
  std::int64_t cfa_offset = 0;
  Saved rbp = Saved::kUnknown;
  std::int64_t rbp_offset = 0;
  Saved return_address = Saved::kUnknown;
  std::int64_t return_address_offset = 0;
  bool signal_frame = false;  // the CIE's 'S' augmentation
};

// fde points at an FDE in .eh_frame (its length word), as _Unwind_Find_FDE returns it;
// function_start is the address its range begins at. False (and *rule untouched) when the
// FDE or its CIE holds something this reader does not understand.
bool read_frame_rule(const void* fde, std::uintptr_t function_start, std::uintptr_t return_address, FrameRule* rule);

}  // namespace brisk::debug
