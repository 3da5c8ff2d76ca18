// SIGINT / SIGTERM / SIGUSR1 recorded, not acted on, while a StopSignals lives.
#include "meshtrain/core/stop_signals.h"

#include <atomic>
#include <chrono>
#include <csignal>

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> stop_signal{0};
std::atomic<unsigned> seen_signals{0};  // bit n: signal n came
// Clock::now() is clock_gettime(CLOCK_MONOTONIC), which is async-signal-safe; 0: no signal yet.
std::atomic<Clock::rep> first_signal_ticks{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<unsigned>::is_always_lock_free &&
                  std::atomic<Clock::rep>::is_always_lock_free,
              "a signal handler may only touch lock-free atomics");

extern "C" void request_stop(int signal_number) {
  Clock::rep none = 0;
  first_signal_ticks.compare_exchange_strong(none, Clock::now().time_since_epoch().count());
  stop_signal.store(signal_number);
  seen_signals.fetch_or(1u << signal_number);
}

}  // namespace

StopSignals::StopSignals(Afterwards afterwards) : afterwards_(afterwards) {
  stop_signal.store(0);
  seen_signals.store(0);
  first_signal_ticks.store(0);
  previous_interrupt_ = std::signal(SIGINT, request_stop);
  previous_terminate_ = std::signal(SIGTERM, request_stop);
  previous_user1_ = std::signal(SIGUSR1, request_stop);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, previous_interrupt_);
  const bool ignored = afterwards_ == Afterwards::ignored;
  std::signal(SIGTERM, ignored ? SIG_IGN : previous_terminate_);
  std::signal(SIGUSR1, ignored ? SIG_IGN : previous_user1_);
}

int stop_signal_received() {
  return stop_signal.load();
}

bool stop_signal_seen(int signal_number) {
  return (seen_signals.load() >> signal_number) & 1u;
}

double seconds_since_stop_signal() {
  const Clock::rep ticks = first_signal_ticks.load();
  if (ticks == 0) return -1.0;
  return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(ticks))).count();
}

}  // namespace meshtrain
