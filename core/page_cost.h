// Which way of making a fresh OS page present costs less on this machine: a page fault (the
// first write) or a system call ahead of it (platform::populate, MADV_POPULATE_WRITE).
//
// Neither wins everywhere. On the AMD EPYC VM of the README's third machine, in the week the
// populate calls went in, a fault cost 10.2 us and a populated page 7.3; on the same kind of VM
// later (kernel 6.18) a fault cost 4.0 us and a populated page 4.6, and beside a thread that
// maps and unmaps, 5.6 against 15.2 (the call takes the process's mmap_lock for reading, which
// a fault on Linux 6.4 and later does not): `bench/os/page_cost.c` measures both. So carving
// measures them as it goes, in the process that runs, and uses the cheaper one.
//
// Carving (threadcache/carve.cc, populate_carved) asks choose() for each fresh OS page it is
// about to write first and makes the page present that way; one page in 8 (is_timed_page) it
// times, and gives the time to record(). One page in kSampleEvery (is_sample_page) takes the
// other way, so that the way not in use keeps a current cost: a machine whose costs change
// under load (another thread mapping and unmapping) moves to the cheaper way within a few
// dozen samples. Until each way has kWarmSamples samples, populate is chosen (the behaviour
// before this measurement existed), the fault taking its sample pages. The costs are
// process-wide relaxed atomics: two threads' records racing lose one sample, which only delays
// a switch.
#pragma once

#include <cstdint>

namespace brisk::page_cost {

enum class Way : std::uint8_t { kFault, kPopulate };

inline constexpr unsigned kSampleEvery = 16;  // one OS page in this many takes the other way
inline constexpr unsigned kWarmSamples = 4;   // samples of each way before the cheaper is chosen

// A hash of the OS page's number (Fibonacci hashing), whose top bits pick the pages below: not
// every 16th or 8th page, which would be the first of every 64 KiB page, where each span starts.
inline std::uint64_t page_hash(std::uintptr_t page) { return (page >> 12) * 0x9E3779B97F4A7C15ull; }
// Whether the OS page at `page` is a sample page: one in kSampleEvery.
inline bool is_sample_page(std::uintptr_t page) { return page_hash(page) >> 60 == 0; }
static_assert(kSampleEvery == 16, "is_sample_page keeps the hash's top 4 bits");
// Whether carving times the page at `page` (and records it): one in 8, the sample pages and as
// many of the others. Not every page, so that where the clock is a system call rather than the
// vDSO's read of the TSC (some virtual machines' clock sources: a microsecond or more a read)
// the two reads cost a quarter of that on average, against a page's several microseconds.
inline bool is_timed_page(std::uintptr_t page) { return page_hash(page) >> 61 == 0; }

// The way for the fresh OS page at `page` (4 KiB aligned).
Way choose(std::uintptr_t page);
// A page made present `way` took ns nanoseconds (a call of several pages: its time divided by
// their number). A sample above 8 times the lower of the two means (a preemption inside the
// timed window, say) counts as that much.
void record(Way way, std::uint64_t ns);

// What the measurement holds now: each way's mean in nanoseconds (0: no sample yet) and its
// number of samples (statistics, tests).
struct Costs {
  std::uint64_t fault_ns, populate_ns;
  std::uint32_t fault_samples, populate_samples;
};
Costs costs();
// Tests: set both means and counts (as if measured); fixed = true keeps them (record() then does
// nothing) and turns the sample pages off, so that choose() takes the cheaper way for every
// page; fixed = false with zero counts starts the measurement afresh.
void set_for_test(const Costs& c, bool fixed);

}  // namespace brisk::page_cost
