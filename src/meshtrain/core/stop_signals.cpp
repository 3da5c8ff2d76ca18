// SIGINT / SIGTERM recorded, not acted on, while a StopSignals lives.
#include "meshtrain/core/stop_signals.h"

#include <atomic>
#include <csignal>

namespace meshtrain {
namespace {

std::atomic<int> stop_signal{0};
extern "C" void request_stop(int signal_number) {
  stop_signal.store(signal_number);
}

}  // namespace

StopSignals::StopSignals() {
  stop_signal.store(0);
  previous_interrupt_ = std::signal(SIGINT, request_stop);
  previous_terminate_ = std::signal(SIGTERM, request_stop);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, previous_interrupt_);
  std::signal(SIGTERM, previous_terminate_);
}

int stop_signal_received() {
  return stop_signal.load();
}

}  // namespace meshtrain
