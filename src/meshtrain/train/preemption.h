// Preemption: why a run stops before its last step, agreed by every rank at a step boundary. A scheduler
// that wants the nodes back sends SIGTERM or SIGUSR1 (SLURM's --signal, scancel, the time limit), or the run
// has used the wall time it was given (exit_duration_in_mins, Megatron's name); every rank then stops at the
// same boundary, the run saves, and the process exits with kRequeueExitStatus so the job script requeues
// it. SIGINT (a user at a terminal) saves too but exits 130: nobody asked for the job to come back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): the run stopped because it
// was asked to make room and its checkpoint is committed; the job script reads it as "requeue me".
constexpr int kRequeueExitStatus = 75;
constexpr int kInterruptedExitStatus = 130;  // 128 + SIGINT, as a shell reports a run stopped by Ctrl-C

enum class StopReason {
  none,
  interrupted,  // SIGINT
  preempted,    // SIGTERM or SIGUSR1
  time_limit,   // exit_duration_in_mins passed
  requested,    // RunControl::stop_after_step (tests)
};

struct StopRequest {
  StopReason reason = StopReason::none;
  std::string cause;                   // "SIGUSR1", "exit_duration_in_mins 30 passed (30.2 min)", ...
  double seconds_since_signal = -1.0;  // the first rank's signal to this boundary; -1 without one
  explicit operator bool() const { return reason != StopReason::none; }
};

// The exit status of `meshtrain train` for a run that ended for `reason` (0 when it ran to its last step).
int exit_status_for(StopReason reason);

// Watches the process's stop signals (core/stop_signals.h, installed by the caller) and the wall-time limit
// counted from `start`.
class PreemptionWatch {
 public:
  using Clock = std::chrono::steady_clock;
  PreemptionWatch(double exit_duration_in_mins, Clock::time_point start);
  // At a step boundary, on every rank (one small world all-reduce): every rank gets the same answer, so
  // they stop at the same step whenever each one's signal came.
  StopRequest agree(Communicator& world) const;
  // After the stop's checkpoint is committed, on every rank: seconds since the first rank's signal.
  static double seconds_since_first_signal(Communicator& world);

 private:
  double exit_duration_in_mins_;  // <= 0: no limit
  Clock::time_point start_;
};

}  // namespace meshtrain
