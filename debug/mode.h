// Debug mode's switch (brisk_debug_enter / brisk_debug_exit / brisk_debug_active): a nesting
// counter, threadcache/debug_switch.h's mode word. How a switch reaches every thread promptly
// is described there.
#pragma once

namespace brisk::debug {

void enter();
void exit();  // an exit without an enter is ignored
bool active();

}  // namespace brisk::debug
