// Spike skipping (skip_step_on_spikes): the running statistic of recent losses a step's loss is checked
// against before its update, and the count of skips in a row.
//
// The rule is MaxText's (optimizers.py, skip_step_on_spikes, after OLMo-core's SkipStepOptimizer): over the
// last skip_step_interval losses (fewer at the start), the mean m and the standard deviation s with Bessel's
// correction (sum of squares / max(1, n - 1)); a loss l is a spike when l - m > skip_step_scaling_factor x s.
// The check starts once the window holds max(2, interval / 2) - 1 losses (MaxText: count + 1 >= max(2,
// interval / 2)), and every checked loss enters the window, a skipped one too, so that a lasting change of
// level becomes the new baseline. One difference: MaxText also checks the gradient norm against its own
// window; here the gradient norm is computed inside the update program, which applies the update in the same
// pass, so only the loss is checked (the update is never started for a skipped step).
//
// The run checks the step's global loss, the same value on every rank (train/run.cpp sums it over the stage,
// data, fsdp, expert and context ranks; tensor peers compute the same sums), so every rank decides alike with
// no collective of its own. The window and the count of skips in a row go into the checkpoint's train state,
// so a resumed run decides as the uninterrupted one would.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>

namespace meshtrain {

class LossSpikeWindow {
 public:
  LossSpikeWindow(int64_t interval, double scaling_factor)
      : interval_(interval), scaling_factor_(scaling_factor) {}

  // Why `loss` is a spike ("loss 7.9 > mean 2.1 + 6 x std 0.05 of the last 20 losses"), or "" when it is not
  // (or the window is still filling). Changes nothing.
  std::string spike_reason(double loss) const;
  // Adds a checked loss to the window (dropping the oldest beyond the interval) and counts the skips in a row
  // (`skipped`: the step was skipped as a spike; false resets the count).
  void record(double loss, bool skipped);
  int64_t skips_in_a_row() const { return skips_in_a_row_; }

  // The checkpoint's form: {"recent_losses": [oldest .. newest], "skips_in_a_row": k}. restore() takes the
  // newest `interval` losses of a saved window (`where` names the checkpoint for errors).
  nlohmann::json to_json() const;
  void restore(const nlohmann::json& saved, const std::string& where);

 private:
  int64_t interval_;
  double scaling_factor_;
  std::deque<double> recent_losses_;  // oldest first, at most interval_
  int64_t skips_in_a_row_ = 0;
};

}  // namespace meshtrain
