// The background thread: returns memory that no running thread would give back (README,
// "Strategy": "Memory comes back without the program's help").
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/lock.h"

namespace brisk {

class Heap;

// Starts the background thread if the BRISK_BACKGROUND lever is on and the process has a
// second thread (a single-threaded program stays single-threaded: unshare, and fork's
// single-threaded shortcuts, keep working). Called when a heap is created and when the
// strategy changes; cheap once the thread runs.
void background_maybe_start();
// Called when the last attached thread heap goes (heap_retire): wakes the thread, which ends
// once it is the process's only running thread (background.cc, background_main).
void background_heaps_gone();
// The child of fork has no background thread; the next heap it creates starts one.
void background_reset_in_child();
// The debug layer's leak scan (debug/leaks.cc) reads the whole process's memory at exit; a
// pass could unmap some of it meanwhile. background_pause_within waits up to `ms`
// milliseconds for a pass under way to end (false: it did not, nothing is held) and holds the
// next one back until background_resume; *threads: how many background threads the process has
// (0 or 1: 1 once the thread runs, so one being started counts as another thread of the
// program), which the scan allows besides its own. Not for a fork child's forking thread
// between prepare and parent (nor does fork take it): the child resets it.
bool background_pause_within(std::uint64_t ms, std::size_t* threads);
void background_resume();
// Fork support: the pass lock, taken after the heap pool's and before the central pools'.
void background_locks_acquire();
void background_locks_release();
void background_locks_reset_in_child();
LockCounts background_lock_counts();  // the pass lock (brisk_get_lock_stats)

// One pass of the background thread's work at time now (milliseconds, platform::now_ms), for
// the thread's loop and for tests with a fake clock. Returns the milliseconds to sleep before
// the next pass.
std::uint64_t background_pass(std::uint64_t now);
// Takes the blocks queued to heap h by other threads, if h's owner is not in a slow path, and
// gives back the spans they leave without a live block; the others go back to h's queue.
// Returns the bytes of spans released. With `purged`, also gives back the pages of h's
// installed spans that have no live block ("purge in place", background.cc; h's owner rebuilds
// them at its next slow path) and adds their bytes to *purged. (Part of each pass, for idle
// heaps, purging; brisk_trim's sweep of every heap, purging; a test may call it.)
std::size_t reclaim_queued_frees(Heap* h, std::size_t* purged = nullptr);
// reclaim_queued_frees for every heap but self with frees queued to it, whatever its owner is
// doing (brisk_trim's sweep), unless a pass holds the table. For a heap about to map a new
// chunk: the wholly freed spans queued to owners that are blocked or descheduled become free
// pages it can take. Returns the bytes of spans released.
std::size_t reclaim_other_queues(Heap* self);
// Tests: where the reclaim's table of spans lies (all of it: its slots and its counts), so a
// test can read the state of its pages (tests/background_test.cc, SpanTable).
void reclaim_table_for_test(const void** start, std::size_t* bytes);
// Bytes the background passes have returned to the OS so far.
std::size_t background_bytes_returned();

}  // namespace brisk
