// Progress bar drawing, the plain-line fallback for logs, and the ETA's moving average.
#include "meshtrain/metrics/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace meshtrain {
namespace {

constexpr double kPlainPeriodSeconds = 10.0;
constexpr double kRedrawPeriodSeconds = 0.1;  // a toy model's thousands of steps/s must not flood a tty
constexpr int kFallbackColumns = 100;
constexpr int kMaxBarWidth = 30;
constexpr int kMinBarWidth = 5;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format(const char* pattern, auto... values) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), pattern, values...);
  return buffer;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!(seconds >= 0.0)) return "--";  // also NaN
  if (seconds >= 100.0 * 86400.0) return ">99d";
  const long long total = std::llround(seconds);
  if (total < 60) return format("%llds", total);
  if (total < 3600) return format("%lldm%02llds", total / 60, total % 60);
  if (total < 86400) return format("%lldh%02lldm", total / 3600, total % 3600 / 60);
  return format("%lldd%02lldh", total / 86400, total % 86400 / 3600);
}

std::string format_bar_line(const std::string& head, double fraction, const std::string& tail, int columns) {
  if (columns <= 0) return head + tail;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int room = columns - 1 - static_cast<int>(head.size() + tail.size()) - 3;  // " [" and "]"
  const int width = std::min(kMaxBarWidth, room);
  std::string line = head;
  if (width >= kMinBarWidth) {
    const int filled = static_cast<int>(fraction * width);
    line += " [" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  }
  line += tail;
  if (static_cast<int>(line.size()) > columns - 1) line.resize(std::max(0, columns - 1));
  return line;
}

std::string format_progress_line(int64_t step, int64_t total_steps, double loss, double tokens_per_second,
                                 double eta_seconds, int columns) {
  const double fraction =
      total_steps > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_steps), 0.0, 1.0)
                      : 1.0;
  const std::string head =
      format("step %lld/%lld", static_cast<long long>(step), static_cast<long long>(total_steps));
  const std::string tail = format(" %d%% loss %.3f | ", static_cast<int>(fraction * 100.0), loss) +
                           format("%.0f tok/s | ETA ", tokens_per_second) + format_duration(eta_seconds);
  return format_bar_line(head, fraction, tail, columns);
}

ProgressBar::ProgressBar(int64_t total_steps, int64_t start_step, std::FILE* stream, int64_t plain_interval)
    : total_steps_(total_steps), stream_(stream), step_(start_step) {
  const char* term = std::getenv("TERM");
  interactive_ = isatty(fileno(stream_)) == 1 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
  plain_interval_ =
      plain_interval > 0 ? plain_interval : std::max<int64_t>(1, (total_steps - start_step) / 20);
}

ProgressBar::ProgressBar(int64_t total, std::FILE* stream, ProgressLineFormat line)
    : ProgressBar(total, 0, stream) {
  line_ = std::move(line);
}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(int64_t step, double loss, double tokens_per_second) {
  update(step, loss, tokens_per_second, steady_seconds());
}

void ProgressBar::update(int64_t step, double loss, double tokens_per_second, double now_seconds) {
  loss_ = loss;
  tokens_per_second_ = tokens_per_second;
  advance(step, now_seconds);
}

void ProgressBar::advance(int64_t step, double now_seconds) {
  if (finished_) return;
  // The first update only sets the reference point: the time before it includes start-up and warm-up.
  if (have_update_ && step > step_ && now_seconds >= now_) {
    const double per_step = (now_seconds - now_) / static_cast<double>(step - step_);
    ++samples_;
    // Running mean for the first samples, then an exponential average over roughly the last 20 steps.
    const double weight = std::max(1.0 / static_cast<double>(samples_), 0.05);
    average_step_seconds_ =
        samples_ == 1 ? per_step : average_step_seconds_ + weight * (per_step - average_step_seconds_);
  }
  step_ = step;
  now_ = now_seconds;
  const bool first = !have_update_;
  have_update_ = true;
  const bool last = step >= total_steps_;
  if (interactive_) {
    if (first || last || now_seconds - printed_time_ >= kRedrawPeriodSeconds) draw();
  } else if (first || last || step - printed_step_ >= plain_interval_ ||
             now_seconds - printed_time_ >= kPlainPeriodSeconds) {
    draw();
  }
}

double ProgressBar::eta_seconds() const {
  if (average_step_seconds_ < 0.0) return -1.0;
  return average_step_seconds_ * static_cast<double>(std::max<int64_t>(0, total_steps_ - step_));
}

void ProgressBar::message(const std::string& text) {
  std::string line = text;
  if (line.empty() || line.back() != '\n') line += '\n';
  if (interactive_ && bar_on_screen_) {
    emit("\r\x1b[K" + line);  // erase the bar, print the message, draw the bar again under it
    bar_on_screen_ = false;
    draw();
  } else {
    emit(line);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!have_update_) return;
  if (interactive_) {
    draw();
    emit("\n");
    bar_on_screen_ = false;
  } else if (printed_step_ != step_) {
    draw();
  }
}

void ProgressBar::draw() {
  if (!have_update_) return;
  const auto line = [&](int width) {
    return line_ ? line_(step_, total_steps_, eta_seconds(), width)
                 : format_progress_line(step_, total_steps_, loss_, tokens_per_second_, eta_seconds(), width);
  };
  if (interactive_) {
    // "\x1b[K" clears what a longer previous line left to the right.
    emit("\r" + line(columns()) + "\x1b[K");
    bar_on_screen_ = true;
  } else {
    emit(line(0) + "\n");
  }
  printed_step_ = step_;
  printed_time_ = now_;
}

void ProgressBar::emit(const std::string& text) {
  // Failures are ignored on purpose: a closed or full console must not stop training.
  std::fwrite(text.data(), 1, text.size(), stream_);
  std::fflush(stream_);
}

int ProgressBar::columns() const {
  winsize size{};
  if (ioctl(fileno(stream_), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return kFallbackColumns;
}

}  // namespace meshtrain
