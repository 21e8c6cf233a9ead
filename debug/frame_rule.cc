#include "debug/frame_rule.h"

#include <cstring>

namespace brisk::debug {
namespace {

// DWARF register numbers on x86-64.
constexpr std::uint64_t kRegRbp = 6;
constexpr std::uint64_t kRegRsp = 7;
constexpr std::uint64_t kRegReturnAddress = 16;

// A reader over [at, end): every read past end fails the reader, and later reads return 0.
class Bytes {
 public:
  Bytes(const std::uint8_t* at, const std::uint8_t* end) : at_(at), end_(end) {}
  bool ok() const { return ok_; }
  bool done() const { return !ok_ || at_ >= end_; }
  const std::uint8_t* at() const { return at_; }
  void fail() { ok_ = false; }

  void skip(std::uint64_t n) {
    if (!ok_ || n > static_cast<std::uint64_t>(end_ - at_)) {
      ok_ = false;
      return;
    }
    at_ += n;
  }
  std::uint64_t fixed(unsigned n) {  // little-endian, n <= 8
    if (!ok_ || n > static_cast<std::uint64_t>(end_ - at_)) {
      ok_ = false;
      return 0;
    }
    std::uint64_t v = 0;
    std::memcpy(&v, at_, n);
    at_ += n;
    return v;
  }
  std::uint8_t byte() { return static_cast<std::uint8_t>(fixed(1)); }
  std::uint64_t uleb() {
    std::uint64_t v = 0;
    for (unsigned shift = 0; ok_; shift += 7) {
      const std::uint8_t b = byte();
      if (shift < 64) v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    return v;
  }
  std::int64_t sleb() {
    std::uint64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b = 0;
    do {
      b = byte();
      if (shift < 64) v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      shift += 7;
    } while (ok_ && (b & 0x80) != 0);
    if (shift < 64 && (b & 0x40) != 0) v |= ~std::uint64_t{0} << shift;
    return static_cast<std::int64_t>(v);
  }
  // A block with a ULEB128 length (a DWARF expression), as a reader of its own: empty, and this
  // reader failed, when it runs past the end.
  Bytes block() {
    const std::uint64_t length = uleb();
    const std::uint8_t* const start = at_;
    skip(length);
    return ok_ ? Bytes(start, start + length) : Bytes(end_, end_);
  }
  // Skips a pointer encoded with a DW_EH_PE_* encoding (its value is not needed).
  void skip_encoded(std::uint8_t encoding) {
    if (encoding == 0xff) return;  // DW_EH_PE_omit
    switch (encoding & 0x0f) {
      case 0x00: skip(8); return;                   // absptr
      case 0x01: case 0x09: (void)uleb(); return;   // uleb128, sleb128
      case 0x02: case 0x0a: skip(2); return;        // udata2, sdata2
      case 0x03: case 0x0b: skip(4); return;        // udata4, sdata4
      case 0x04: case 0x0c: skip(8); return;        // udata8, sdata8
      default: fail();
    }
  }

 private:
  const std::uint8_t* at_;
  const std::uint8_t* end_;
  bool ok_ = true;
};

// The rules the walk needs, as a call-frame program leaves them.
struct Row {
  FrameRule::Cfa cfa = FrameRule::Cfa::kUnknown;
  std::uint64_t cfa_register = 0;
  std::int64_t cfa_offset = 0;
  FrameRule::Saved rbp = FrameRule::Saved::kSame;  // callee-saved: unchanged unless a rule says
  std::int64_t rbp_offset = 0;
  FrameRule::Saved return_address = FrameRule::Saved::kUnknown;
  std::int64_t return_address_offset = 0;
};

void set_cfa_register(Row* row, std::uint64_t reg, std::int64_t offset) {
  row->cfa_register = reg;
  row->cfa_offset = offset;
  row->cfa = reg == kRegRsp ? FrameRule::Cfa::kRspOffset
             : reg == kRegRbp ? FrameRule::Cfa::kRbpOffset
                              : FrameRule::Cfa::kUnknown;  // another register: the walk tracks none
}

void set_saved(Row* row, std::uint64_t reg, FrameRule::Saved saved, std::int64_t offset) {
  if (reg == kRegRbp) {
    row->rbp = saved;
    row->rbp_offset = offset;
  } else if (reg == kRegReturnAddress) {
    row->return_address = saved;
    row->return_address_offset = offset;
  }
}

void restore(Row* row, const Row& initial, std::uint64_t reg) {
  if (reg == kRegRbp) {
    row->rbp = initial.rbp;
    row->rbp_offset = initial.rbp_offset;
  } else if (reg == kRegReturnAddress) {
    row->return_address = initial.return_address;
    row->return_address_offset = initial.return_address_offset;
  }
}

// A DWARF expression block of exactly "DW_OP_breg6 N" (deref false) or "DW_OP_breg6 N;
// DW_OP_deref" (deref true): *offset = N. Every other expression is not understood.
bool rbp_expression(Bytes block, bool deref, std::int64_t* offset) {
  if (block.byte() != 0x76) return false;  // DW_OP_breg6
  *offset = block.sleb();
  if (deref && block.byte() != 0x06) return false;  // DW_OP_deref
  return block.ok() && block.done();
}

struct Cie {
  std::uint64_t code_align = 1;
  std::int64_t data_align = 1;
  std::uint64_t return_register = kRegReturnAddress;
  std::uint8_t fde_encoding = 0;  // DW_EH_PE_absptr
  bool augmented = false;         // 'z': augmentation data have a length
  bool signal_frame = false;
  const std::uint8_t* program = nullptr;
  const std::uint8_t* end = nullptr;
};

bool read_cie(const std::uint8_t* at, Cie* cie) {
  std::uint32_t length;
  std::memcpy(&length, at, 4);
  if (length == 0 || length == 0xffffffffu) return false;  // a terminator, or 64-bit DWARF
  Bytes in(at + 4, at + 4 + length);
  if (in.fixed(4) != 0) return false;  // .eh_frame's CIE id
  const std::uint8_t version = in.byte();
  if (version != 1 && version != 3) return false;
  const char* augmentation = reinterpret_cast<const char*>(in.at());
  const std::size_t augmentation_length = strnlen(augmentation, static_cast<std::size_t>(at + 4 + length - in.at()));
  in.skip(augmentation_length + 1);
  cie->code_align = in.uleb();
  cie->data_align = in.sleb();
  cie->return_register = version == 1 ? in.byte() : in.uleb();
  const std::uint8_t* data_end = nullptr;
  for (std::size_t i = 0; i < augmentation_length && in.ok(); ++i) {
    switch (augmentation[i]) {
      case 'z':
        if (i != 0) return false;
        cie->augmented = true;
        {
          const std::uint64_t data_length = in.uleb();
          data_end = in.at() + data_length;
        }
        break;
      case 'R': cie->fde_encoding = in.byte(); break;
      case 'L': (void)in.byte(); break;  // the LSDA's encoding: the FDE's augmentation data say where
      case 'P': in.skip_encoded(in.byte()); break;
      case 'S': cie->signal_frame = true; break;
      default: return false;  // "eh" and unknown augmentations
    }
  }
  if (!in.ok()) return false;
  if (data_end != nullptr) {
    if (data_end < in.at()) return false;
    in.skip(static_cast<std::uint64_t>(data_end - in.at()));
  }
  cie->program = in.at();
  cie->end = at + 4 + length;
  return in.ok() && cie->return_register == kRegReturnAddress;
}

// Runs a call-frame program over row while the location stays below return_address. False if
// an instruction is not understood.
bool run(Bytes in, const Cie& cie, const Row& initial, std::uintptr_t return_address, std::uintptr_t* location,
         Row* row) {
  constexpr int kStates = 8;
  Row saved[kStates];
  int states = 0;
  while (!in.done() && *location < return_address) {
    const std::uint8_t op = in.byte();
    const std::uint8_t low = op & 0x3f;
    switch (op >> 6) {
      case 1: *location += low * cie.code_align; continue;                                       // advance_loc
      case 2: set_saved(row, low, FrameRule::Saved::kAtCfa, static_cast<std::int64_t>(in.uleb()) * cie.data_align); continue;  // offset
      case 3: restore(row, initial, low); continue;                                              // restore
      default: break;
    }
    switch (op) {
      case 0x00: break;                                                          // nop
      case 0x02: *location += in.fixed(1) * cie.code_align; break;               // advance_loc1
      case 0x03: *location += in.fixed(2) * cie.code_align; break;               // advance_loc2
      case 0x04: *location += in.fixed(4) * cie.code_align; break;               // advance_loc4
      case 0x05: {                                                               // offset_extended
        const std::uint64_t reg = in.uleb();
        set_saved(row, reg, FrameRule::Saved::kAtCfa, static_cast<std::int64_t>(in.uleb()) * cie.data_align);
        break;
      }
      case 0x11: {                                                               // offset_extended_sf
        const std::uint64_t reg = in.uleb();
        set_saved(row, reg, FrameRule::Saved::kAtCfa, in.sleb() * cie.data_align);
        break;
      }
      case 0x06: restore(row, initial, in.uleb()); break;                        // restore_extended
      case 0x07: set_saved(row, in.uleb(), FrameRule::Saved::kUnknown, 0); break;  // undefined
      case 0x08: set_saved(row, in.uleb(), FrameRule::Saved::kSame, 0); break;     // same_value
      case 0x09:                                                                 // register
      case 0x14:                                                                 // val_offset
        set_saved(row, in.uleb(), FrameRule::Saved::kUnknown, 0);
        (void)in.uleb();
        break;
      case 0x15:                                                                 // val_offset_sf
        set_saved(row, in.uleb(), FrameRule::Saved::kUnknown, 0);
        (void)in.sleb();
        break;
      case 0x0a:                                                                 // remember_state
        if (states == kStates) return false;
        saved[states++] = *row;
        break;
      case 0x0b:                                                                 // restore_state
        if (states == 0) return false;
        *row = saved[--states];
        break;
      case 0x0c: {                                                               // def_cfa
        const std::uint64_t reg = in.uleb();
        set_cfa_register(row, reg, static_cast<std::int64_t>(in.uleb()));
        break;
      }
      case 0x12: {                                                               // def_cfa_sf
        const std::uint64_t reg = in.uleb();
        set_cfa_register(row, reg, in.sleb() * cie.data_align);
        break;
      }
      case 0x0d:                                                                 // def_cfa_register
        if (row->cfa == FrameRule::Cfa::kLoadRbp) return false;  // keeps an offset there is none of
        set_cfa_register(row, in.uleb(), row->cfa_offset);
        break;
      case 0x0e:                                                                 // def_cfa_offset
        if (row->cfa == FrameRule::Cfa::kLoadRbp) return false;
        row->cfa_offset = static_cast<std::int64_t>(in.uleb());
        break;
      case 0x13:                                                                 // def_cfa_offset_sf
        if (row->cfa == FrameRule::Cfa::kLoadRbp) return false;
        row->cfa_offset = in.sleb() * cie.data_align;
        break;
      case 0x0f: {                                                               // def_cfa_expression
        std::int64_t offset = 0;
        if (rbp_expression(in.block(), true, &offset)) {
          row->cfa = FrameRule::Cfa::kLoadRbp;
          row->cfa_offset = offset;
        } else {
          row->cfa = FrameRule::Cfa::kUnknown;
        }
        row->cfa_register = 0;
        break;
      }
      case 0x10:                                                                 // expression
      case 0x16: {                                                               // val_expression
        const std::uint64_t reg = in.uleb();
        std::int64_t offset = 0;
        if (rbp_expression(in.block(), false, &offset) && op == 0x10) set_saved(row, reg, FrameRule::Saved::kAtRbp, offset);
        else set_saved(row, reg, FrameRule::Saved::kUnknown, 0);
        break;
      }
      case 0x2e: (void)in.uleb(); break;                                         // GNU_args_size
      case 0x2f: {                                                               // GNU_negative_offset_extended
        const std::uint64_t reg = in.uleb();
        set_saved(row, reg, FrameRule::Saved::kAtCfa, -static_cast<std::int64_t>(in.uleb()) * cie.data_align);
        break;
      }
      default: return false;  // set_loc (an encoded address) and anything newer
    }
  }
  return in.ok();
}

}  // namespace

bool read_frame_rule(const void* fde, std::uintptr_t function_start, std::uintptr_t return_address, FrameRule* rule) {
  const auto* at = static_cast<const std::uint8_t*>(fde);
  std::uint32_t length, cie_pointer;
  std::memcpy(&length, at, 4);
  if (length == 0 || length == 0xffffffffu) return false;
  std::memcpy(&cie_pointer, at + 4, 4);
  if (cie_pointer == 0) return false;  // a CIE, not an FDE
  Cie cie;
  if (!read_cie(at + 4 - cie_pointer, &cie)) return false;

  Bytes in(at + 8, at + 4 + length);
  in.skip_encoded(cie.fde_encoding);         // the range's start: function_start
  in.skip_encoded(cie.fde_encoding & 0x0f);  // its length, never relative
  if (cie.augmented) in.skip(in.uleb());
  if (!in.ok()) return false;

  // A CIE's program sets up the initial rules without advancing (if it advanced, the rows
  // would apply from the function's start all the same).
  Row row;
  std::uintptr_t location = function_start;
  if (!run(Bytes(cie.program, cie.end), cie, Row{}, ~std::uintptr_t{0}, &location, &row)) return false;
  const Row initial = row;
  location = function_start;
  if (!run(in, cie, initial, return_address, &location, &row)) return false;

  rule->cfa = row.cfa;
  rule->cfa_offset = row.cfa_offset;
  rule->rbp = row.rbp;
  rule->rbp_offset = row.rbp_offset;
  rule->return_address = row.return_address;
  rule->return_address_offset = row.return_address_offset;
  rule->signal_frame = cie.signal_frame;
  return true;
}

}  // namespace brisk::debug
