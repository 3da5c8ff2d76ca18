// Preemption: the agreed stop at a step boundary, its reason and the job's exit status.
#include "meshtrain/train/preemption.h"

#include <csignal>
#include <cstdio>
#include <vector>

#include "meshtrain/core/stop_signals.h"

namespace meshtrain {
namespace {

// Seconds since the first rank's signal: every rank reports its own (or -1), the largest is the first.
double agreed_signal_age(Communicator& world, const char* name) {
  // Microseconds as an integer: the reduction is exact and the same on every rank.
  int64_t age_us = static_cast<int64_t>(seconds_since_stop_signal() * 1e6);
  if (world.size() > 1) world.all_reduce(comm_buffer(&age_us, 1), ReduceOp::max, name);
  return age_us < 0 ? -1.0 : static_cast<double>(age_us) / 1e6;
}

}  // namespace

int exit_status_for(StopReason reason) {
  switch (reason) {
    case StopReason::preempted:
    case StopReason::time_limit:
      return kRequeueExitStatus;
    case StopReason::interrupted:
      return kInterruptedExitStatus;
    case StopReason::none:
    case StopReason::requested:
      return 0;
  }
  return 0;
}

PreemptionWatch::PreemptionWatch(double exit_duration_in_mins, Clock::time_point start)
    : exit_duration_in_mins_(exit_duration_in_mins), start_(start) {}

StopRequest PreemptionWatch::agree(Communicator& world) const {
  const double minutes = std::chrono::duration<double>(Clock::now() - start_).count() / 60.0;
  // [SIGINT seen, SIGTERM seen, SIGUSR1 seen, over the time limit, minutes x 1000 (for the message)]: the
  // largest over the ranks of each.
  std::vector<int64_t> flags = {stop_signal_seen(SIGINT), stop_signal_seen(SIGTERM),
                                stop_signal_seen(SIGUSR1),
                                exit_duration_in_mins_ > 0.0 && minutes > exit_duration_in_mins_,
                                static_cast<int64_t>(minutes * 1000.0)};
  if (world.size() > 1) world.all_reduce(comm_buffer(flags), ReduceOp::max, "step/stop_request");
  StopRequest request;
  // A scheduler's signal wins over Ctrl-C: the job must come back whatever else happened.
  if (flags[1] || flags[2]) {
    request.reason = StopReason::preempted;
    request.cause = flags[1] && flags[2] ? "SIGTERM and SIGUSR1" : flags[1] ? "SIGTERM" : "SIGUSR1";
  } else if (flags[3]) {
    request.reason = StopReason::time_limit;
    char text[160];
    std::snprintf(text, sizeof text, "exit_duration_in_mins %g passed (%.2f min since the run started)",
                  exit_duration_in_mins_, static_cast<double>(flags[4]) / 1000.0);
    request.cause = text;
  } else if (flags[0]) {
    request.reason = StopReason::interrupted;
    request.cause = "SIGINT";
  }
  if (request.reason == StopReason::preempted || request.reason == StopReason::interrupted)
    request.seconds_since_signal = agreed_signal_age(world, "step/stop_signal_age");
  return request;
}

double PreemptionWatch::seconds_since_first_signal(Communicator& world) {
  return agreed_signal_age(world, "checkpoint/stop_signal_age");
}

}  // namespace meshtrain
