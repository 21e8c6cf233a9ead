// debug/frame_rule: the rule of a frame read from call-frame information, on hand-made .eh_frame
// bytes (rows applied below the return address, remembered states, and what the frame cache
// cannot use). The rules of real frames are checked against the unwinder in stack_trace_test.
#include "debug/frame_rule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using brisk::debug::FrameRule;

// A CIE ("zR", or "zRS" for a signal frame) and one FDE after it, as .eh_frame holds them:
// the FDE's program is fde_program, its range starts at kStart.
constexpr std::uintptr_t kStart = 0x1000;
std::vector<std::uint8_t> EhFrame(const std::vector<std::uint8_t>& fde_program, bool signal_frame = false) {
  std::vector<std::uint8_t> cie = {0, 0, 0, 0, 1, 'z', 'R'};  // id 0, version 1
  if (signal_frame) cie.push_back('S');
  // code alignment 1, data alignment -8, return address column 16, one byte of augmentation
  // data (the FDE's pointers: DW_EH_PE_udata4), then def_cfa rsp+8 and offset rip at cfa-8.
  for (std::uint8_t b : {0, 1, 0x78, 16, 1, 0x03, 0x0c, 7, 8, 0x90, 1}) cie.push_back(b);
  while (cie.size() % 4 != 0) cie.push_back(0);  // DW_CFA_nop
  std::vector<std::uint8_t> out;
  auto word = [&out](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  word(static_cast<std::uint32_t>(cie.size()));
  out.insert(out.end(), cie.begin(), cie.end());
  const std::size_t fde_at = out.size();
  std::vector<std::uint8_t> body;
  for (std::uint8_t b : {0x00, 0x10, 0, 0, 0x00, 0x01, 0, 0, 0}) body.push_back(b);  // start, length, no augmentation data
  body.insert(body.end(), fde_program.begin(), fde_program.end());
  while ((body.size() + 4) % 4 != 0) body.push_back(0);
  word(static_cast<std::uint32_t>(body.size() + 4));
  word(static_cast<std::uint32_t>(fde_at + 4));  // back to the CIE from this word
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.begin(), 0);  // room to find the FDE: its offset is returned through out[0]
  out[0] = static_cast<std::uint8_t>(fde_at + 1);
  return out;
}

FrameRule Read(const std::vector<std::uint8_t>& eh_frame, std::uintptr_t return_address, bool* ok) {
  FrameRule rule;
  *ok = brisk::debug::read_frame_rule(eh_frame.data() + eh_frame[0], kStart, return_address, &rule);
  return rule;
}

TEST(FrameRule, RowsApplyBelowTheReturnAddressAndRememberedStatesComeBack) {
  // push rbp; sub rsp; ... an epilogue between remember_state and restore_state.
  const auto eh = EhFrame({0x41, 0x0e, 16, 0x86, 2,   // +1: cfa rsp+16, rbp at cfa-16
                           0x44, 0x0e, 48,            // +4: cfa rsp+48
                           0x48, 0x0a, 0x0e, 8, 0xc6,  // +8: remember; cfa rsp+8, rbp restored
                           0x41, 0x0b});              // +1: restore_state
  bool ok = false;
  FrameRule r = Read(eh, kStart + 1, &ok);  // a call at the first byte: nothing pushed yet
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa, FrameRule::Cfa::kRspOffset);
  EXPECT_EQ(r.cfa_offset, 8);
  EXPECT_EQ(r.rbp, FrameRule::Saved::kSame);
  EXPECT_EQ(r.return_address, FrameRule::Saved::kAtCfa);
  EXPECT_EQ(r.return_address_offset, -8);
  r = Read(eh, kStart + 6, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa_offset, 48);
  EXPECT_EQ(r.rbp, FrameRule::Saved::kAtCfa);
  EXPECT_EQ(r.rbp_offset, -16);
  r = Read(eh, kStart + 14, &ok);  // inside the epilogue
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa_offset, 8);
  EXPECT_EQ(r.rbp, FrameRule::Saved::kSame);
  r = Read(eh, kStart + 15, &ok);  // past it: the remembered row again
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa_offset, 48);
  EXPECT_EQ(r.rbp, FrameRule::Saved::kAtCfa);
  EXPECT_FALSE(r.signal_frame);
}

TEST(FrameRule, WhatTheCacheCannotUseIsReportedAsSuch) {
  bool ok = false;
  // A CFA in R10 (a DRAP prologue before RBP is set up).
  FrameRule r = Read(EhFrame({0x41, 0x0c, 10, 0}), kStart + 2, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa, FrameRule::Cfa::kUnknown);
  // A CFA expression other than DW_OP_breg6 N; DW_OP_deref (here DW_OP_breg7 8).
  r = Read(EhFrame({0x41, 0x0f, 2, 0x77, 8}), kStart + 2, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa, FrameRule::Cfa::kUnknown);
  // The DRAP expression itself.
  r = Read(EhFrame({0x41, 0x0f, 3, 0x76, 0x58, 0x06, 0x10, 6, 2, 0x76, 0}), kStart + 2, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(r.cfa, FrameRule::Cfa::kLoadRbp);
  EXPECT_EQ(r.cfa_offset, -40);
  EXPECT_EQ(r.rbp, FrameRule::Saved::kAtRbp);
  EXPECT_EQ(r.rbp_offset, 0);
  // A signal frame's CIE.
  r = Read(EhFrame({}, true), kStart + 2, &ok);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(r.signal_frame);
  // An opcode this reader does not know (DW_CFA_set_loc), and a block running past the FDE.
  Read(EhFrame({0x01, 0, 0x10, 0, 0, 0, 0, 0, 0}), kStart + 2, &ok);
  EXPECT_FALSE(ok);
  Read(EhFrame({0x0f, 100, 0x76}), kStart + 2, &ok);
  EXPECT_FALSE(ok);
}

}  // namespace
