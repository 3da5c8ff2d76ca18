// SIGINT / SIGTERM as a request to stop cleanly: a run saves and stops at a step every rank agrees on, a
// conversion removes its temporary output.
#pragma once

namespace meshtrain {

// While it lives, SIGINT / SIGTERM only record the signal (stop_signal_received()) so the work in progress
// can end cleanly; restores the handlers it replaced when it ends.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*previous_interrupt_)(int);
  void (*previous_terminate_)(int);
};
// The signal a live StopSignals recorded, or 0.
int stop_signal_received();

}  // namespace meshtrain
