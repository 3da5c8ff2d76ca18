// SIGINT, SIGTERM and SIGUSR1 as a request to stop cleanly: a run saves and stops at a step every rank
// agrees on, a conversion removes its temporary output. SIGTERM and SIGUSR1 are what a scheduler sends before
// it takes the job's nodes (SLURM's --signal, scancel, the time limit); SIGINT is a user at a terminal.
#pragma once

namespace meshtrain {

// While it lives, SIGINT / SIGTERM / SIGUSR1 only record the signal (stop_signal_received()) and when the
// first one came, so the work in progress can end cleanly. When it ends it restores the handlers it replaced,
// or (Afterwards::ignored) ignores SIGTERM and SIGUSR1 from then on: a run that stopped for a scheduler's
// signal is only finishing its exit, and a late copy of the signal (mpirun's daemon forwards SIGUSR1 that
// SLURM also sends the ranks) must not end it with another status.
class StopSignals {
 public:
  enum class Afterwards { restored, ignored };
  explicit StopSignals(Afterwards afterwards = Afterwards::restored);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*previous_interrupt_)(int);
  void (*previous_terminate_)(int);
  void (*previous_user1_)(int);
  Afterwards afterwards_;
};
// The last signal a live StopSignals recorded, or 0.
int stop_signal_received();
// Whether a live StopSignals recorded this signal (SIGINT, SIGTERM or SIGUSR1) at least once.
bool stop_signal_seen(int signal_number);
// Seconds since the first recorded signal (steady clock), or a negative number when none came.
double seconds_since_stop_signal();

}  // namespace meshtrain
