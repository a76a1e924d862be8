#pragma once
// Checks of device-side conditions that are read back later instead of now.
//
// Note [Deferred device checks]: an op that validates its inputs on the device (an embedding's
// indices, a cross-entropy's targets) would have to read the verdict back at once to throw, a
// host synchronization in the middle of every training step. Instead the op queues the check's
// device half (a kernel writing a small verdict), makes its own kernels safe for the bad values
// (an out-of-range index gathers zeros and scatters nothing; a bad target gives a NaN loss and a
// zero gradient), and registers the host half here with an event recorded after the verdict.
// Pending checks run, oldest first, at the next point where the host waits for the device anyway:
// a copy of device memory to the host (item(), to("cpu"), a loss read at a log interval) and
// cuda_synchronize(). The first failure is thrown there as a td::Error naming the op, the value
// and its position (the op's own message, with a note that the check was deferred). At most
// kMaxPending checks wait; the next one runs them all at once (a synchronization per that many
// calls of a step that never reads anything back).
#include <functional>
#include <string>

#include "runtime/stream.cuh"

namespace td::cuda {

inline constexpr size_t kMaxPendingChecks = 1024;

// Registers `verify` to run once the work queued on `stream` so far has completed. It returns
// an error message, or "" when the check passed; it may read device memory synchronously (it runs
// at a point where the host waits anyway) and keeps alive whatever it captures.
void defer_check(const Stream& stream, std::function<std::string()> verify);

// Runs every pending check (all devices, oldest first); throws td::Error carrying the first
// failure's message after running them all. Does nothing when none is pending.
void run_deferred_checks();

// How many checks are pending.
size_t pending_deferred_checks();

}  // namespace td::cuda
