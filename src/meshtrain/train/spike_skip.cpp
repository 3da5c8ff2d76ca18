#include "meshtrain/train/spike_skip.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::string LossSpikeWindow::spike_reason(double loss) const {
  const auto n = static_cast<int64_t>(recent_losses_.size());
  if (n + 1 < std::max<int64_t>(2, interval_ / 2)) return "";  // MaxText's minimum history
  double sum = 0.0;
  for (double value : recent_losses_) sum += value;
  const double mean = sum / static_cast<double>(std::max<int64_t>(n, 1));
  double squares = 0.0;
  for (double value : recent_losses_) squares += (value - mean) * (value - mean);
  const double deviation = std::sqrt(squares / static_cast<double>(std::max<int64_t>(n - 1, 1)));
  if (loss - mean <= scaling_factor_ * deviation) return "";
  char text[200];
  std::snprintf(text, sizeof text, "loss %.6g > mean %.6g + %g x std %.4g of the last %lld losses", loss,
                mean, scaling_factor_, deviation, static_cast<long long>(n));
  return text;
}

void LossSpikeWindow::record(double loss, bool skipped) {
  recent_losses_.push_back(loss);
  if (static_cast<int64_t>(recent_losses_.size()) > interval_) recent_losses_.pop_front();
  skips_in_a_row_ = skipped ? skips_in_a_row_ + 1 : 0;
}

nlohmann::json LossSpikeWindow::to_json() const {
  return {{"recent_losses", nlohmann::json(recent_losses_)}, {"skips_in_a_row", skips_in_a_row_}};
}

void LossSpikeWindow::restore(const nlohmann::json& saved, const std::string& where) {
  const bool valid = saved.is_object() && saved.contains("recent_losses") &&
                     saved["recent_losses"].is_array() && saved.contains("skips_in_a_row") &&
                     saved["skips_in_a_row"].is_number_integer() &&
                     std::all_of(saved["recent_losses"].begin(), saved["recent_losses"].end(),
                                 [](const nlohmann::json& value) { return value.is_number(); });
  if (!valid) {
    fail(where, "{\"recent_losses\": [numbers], \"skips_in_a_row\": integer}", saved.dump(),
         "the checkpoint is damaged; resume from another one");
  }
  recent_losses_.clear();
  for (const nlohmann::json& value : saved["recent_losses"]) recent_losses_.push_back(value.get<double>());
  while (static_cast<int64_t>(recent_losses_.size()) > interval_) recent_losses_.pop_front();
  skips_in_a_row_ = saved["skips_in_a_row"].get<int64_t>();
}

}  // namespace meshtrain
