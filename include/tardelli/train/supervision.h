#pragma once
// The rank side of supervised restarts (python -m tardelli.launch --max-restarts; the launcher
// is python/tardelli/distributed/supervisor.py): which attempt this is, why the previous one
// failed, and the heartbeat files the launcher watches for hangs. The same environment and file
// format as python/tardelli/distributed/supervisor.py's heartbeat(), so any program
// (Python or C++) runs under the same supervisor.
#include <cstdint>
#include <optional>
#include <string>

namespace td::train {

// TD_RESTART_ATTEMPT: this job's attempt (0 for the first), nullopt when not supervised.
std::optional<int> supervised_attempt();
// TD_RESTART_CAUSE: why the previous attempt failed (empty for attempt 0).
std::string restart_cause();
// Tells the launcher that world rank `rank` is alive and has finished `step` (done: its work is
// over): TD_HEARTBEAT_DIR/rank<R>, JSON {rank, pid, step, done}, replaced atomically. Nothing
// when not supervised. Testing aid TD_TEST_FAULT "attempt<A>:rank<R>:step<S>:(kill|stop)[,...]":
// rank R of attempt A sends itself SIGKILL or SIGSTOP at the heartbeat of step S, before
// writing it. td::Error naming the variable when it is malformed.
void heartbeat(int rank, int64_t step, bool done = false);

}  // namespace td::train
