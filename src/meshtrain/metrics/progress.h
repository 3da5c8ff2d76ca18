// Console progress of a run: a redrawn one-line bar on a terminal, plain periodic lines in logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace meshtrain {

// "42s", "4m12s", "1h02m", "3d04h"; "--" when unknown (negative, NaN), ">99d" beyond 99 days.
std::string format_duration(double seconds);

// One progress line: "step 120/600 [#####.....] 20% loss 3.412 | 1843 tok/s | ETA 4m12s". With
// `columns` > 0 the bar is sized so the line fits in columns - 1 (a full-width line would wrap and break
// the '\r' redraw), and dropped, then the text cut, when it cannot fit; `columns` <= 0 gives the plain
// form without a bar. A negative `eta_seconds` prints "ETA --".
std::string format_progress_line(int64_t step, int64_t total_steps, double loss, double tokens_per_second,
                                 double eta_seconds, int columns);

// "HEAD [#####.....] TAIL" fitted into `columns` - 1 as format_progress_line does (the bar dropped, then the
// text cut, when it cannot fit); `columns` <= 0: "HEAD TAIL" without a bar. `fraction` is clamped to [0, 1].
std::string format_bar_line(const std::string& head, double fraction, const std::string& tail, int columns);

// The line of a bar over any work: (done, total, eta_seconds, columns) -> the text, usually
// format_bar_line's.
using ProgressLineFormat =
    std::function<std::string(int64_t done, int64_t total, double eta_seconds, int columns)>;

class ProgressBar {
 public:
  // `start_step`: steps already done when the run starts (resume). `stream` is usually stderr. On a
  // terminal (and TERM is not "dumb") the bar is redrawn in place; otherwise a plain line is printed
  // every `plain_interval` steps (0: about 20 lines over the run) or every 10 s, whichever comes first.
  ProgressBar(int64_t total_steps, int64_t start_step, std::FILE* stream, int64_t plain_interval = 0);
  // A bar over other work (bytes read, documents): `line` draws it; advance() moves it.
  ProgressBar(int64_t total, std::FILE* stream, ProgressLineFormat line);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step`: steps completed so far (start_step < step <= total_steps).
  void update(int64_t step, double loss, double tokens_per_second);
  // The same at `now_seconds` on any monotonic clock (tests drive time through this).
  void update(int64_t step, double loss, double tokens_per_second, double now_seconds);
  // `done` units of work of the bar's total, at `now_seconds` (any monotonic clock), for a bar with a line
  // format.
  void advance(int64_t done, double now_seconds);
  // Prints `text` as its own line above the bar, then redraws the bar.
  void message(const std::string& text);
  // Draws the final state and ends the line; later updates are ignored. Also called by the destructor.
  void finish();

  bool interactive() const { return interactive_; }
  // Seconds left by the moving average of step time; negative until two updates have been seen.
  double eta_seconds() const;

 private:
  void draw();
  void emit(const std::string& text);
  int columns() const;

  int64_t total_steps_;
  std::FILE* stream_;
  bool interactive_;
  int64_t plain_interval_;
  bool finished_ = false;
  ProgressLineFormat line_;  // empty: the training line (format_progress_line)
  // Latest update.
  int64_t step_;
  double loss_ = 0.0, tokens_per_second_ = 0.0, now_ = 0.0;
  bool have_update_ = false;
  // Moving average of seconds per step.
  double average_step_seconds_ = -1.0;
  int64_t samples_ = 0;
  // What was last drawn / printed.
  bool bar_on_screen_ = false;
  int64_t printed_step_ = -1;
  double printed_time_ = 0.0;
};

}  // namespace meshtrain
