#include "meshtrain/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

namespace meshtrain {

double LearningRateSchedule::at(int64_t step) const {
  if (step >= length) return 0.0;
  const double t = static_cast<double>(step);
  const double W = static_cast<double>(warmup_steps);
  // Warmup starts above zero so that step 0 already moves the weights.
  if (step < warmup_steps) return peak * (t + 1.0) / (W + 1.0);
  const int64_t decay_start = warmup_steps + stable_steps;
  if (step < decay_start) return peak;
  double shape = 0.0;  // g(x): 1 at the decay's start, 0 at its end
  if (type == LrScheduleType::cosine) {
    const double x = std::min(1.0, (t - W) / std::max(1.0, static_cast<double>(length) - W));
    shape = 0.5 * (1.0 + std::cos(std::numbers::pi * x));
  } else {
    const double x = decay_steps > 1
                         ? static_cast<double>(step - decay_start) / static_cast<double>(decay_steps - 1)
                         : 1.0;
    switch (decay_style) {
      case WsdDecayStyle::linear:
        shape = 1.0 - x;
        break;
      case WsdDecayStyle::cosine:
        shape = 0.5 * (1.0 + std::cos(std::numbers::pi * x));
        break;
      case WsdDecayStyle::one_minus_sqrt:
        shape = 1.0 - std::sqrt(x);
        break;
    }
  }
  return peak * (final_fraction + (1.0 - final_fraction) * shape);
}

LearningRateSchedule learning_rate_schedule(const Config& config) {
  LearningRateSchedule schedule;
  schedule.type = config.lr_schedule_type;
  schedule.decay_style = config.wsd_decay_style;
  schedule.peak = config.learning_rate;
  schedule.final_fraction = config.learning_rate_final_fraction;
  schedule.length = std::max<int64_t>(
      config.learning_rate_schedule_steps == -1 ? config.steps : config.learning_rate_schedule_steps, 1);
  const auto L = static_cast<double>(schedule.length);
  schedule.warmup_steps = static_cast<int64_t>(std::floor(config.warmup_steps_fraction * L));
  const int64_t after_warmup = schedule.length - schedule.warmup_steps;
  switch (config.lr_schedule_type) {
    case LrScheduleType::cosine:
      schedule.decay_steps = after_warmup;
      break;
    case LrScheduleType::wsd:
      // config.cpp refuses fractions summing above 1; the min guards their rounding.
      schedule.decay_steps =
          std::min(after_warmup, static_cast<int64_t>(std::floor(config.wsd_decay_steps_fraction * L)));
      schedule.stable_steps = after_warmup - schedule.decay_steps;
      break;
    case LrScheduleType::constant:
      schedule.stable_steps = after_warmup;
      break;
  }
  return schedule;
}

namespace {

std::string rate_text(double rate) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", rate);
  return text;
}

// "  decay     91..100    3e-04 .. 3e-05": a phase of `count` steps from 0-based step `first`.
std::string phase_row(const LearningRateSchedule& schedule, const char* name, int64_t first, int64_t count) {
  if (count == 0) return "";
  const int64_t last = first + count - 1;
  const std::string steps = std::to_string(first + 1) + ".." + std::to_string(last + 1);
  const std::string rates = count == 1 || schedule.at(first) == schedule.at(last)
                                ? rate_text(schedule.at(first))
                                : rate_text(schedule.at(first)) + " .. " + rate_text(schedule.at(last));
  char row[160];
  std::snprintf(row, sizeof row, "  %-9s %-17s %s\n", name, steps.c_str(), rates.c_str());
  return row;
}

}  // namespace

std::string learning_rate_schedule_table(const LearningRateSchedule& schedule, int64_t steps) {
  const int64_t L = schedule.length;
  std::string shape = lr_schedule_type_name(schedule.type);
  if (schedule.type == LrScheduleType::wsd)
    shape += std::string(" (") + wsd_decay_style_name(schedule.decay_style) + " decay)";
  std::string text = "learning rate: " + shape + " schedule of " + std::to_string(L) + " steps, peak " +
                     rate_text(schedule.peak) +
                     (schedule.type == LrScheduleType::constant
                          ? std::string()
                          : ", final " + rate_text(schedule.final_fraction) + " x peak") +
                     "\n";
  char header[160];
  std::snprintf(header, sizeof header, "  %-9s %-17s %s\n", "phase", "steps", "lr");
  text += header;
  text += phase_row(schedule, "warmup", 0, schedule.warmup_steps);
  text += phase_row(schedule, "stable", schedule.warmup_steps, schedule.stable_steps);
  text += phase_row(schedule, "decay", schedule.warmup_steps + schedule.stable_steps, schedule.decay_steps);
  char after[160];
  std::snprintf(after, sizeof after, "  %-9s %-17s 0 (MaxText's choice: the weights stop moving)\n", "after",
                (std::to_string(L + 1) + "..").c_str());
  text += after;
  text += "  this run: " + std::to_string(steps) + " steps, the last at lr " +
          rate_text(schedule.at(std::max<int64_t>(steps, 1) - 1)) +
          (steps < L   ? " (the schedule goes on: resume with more steps to follow it)"
           : steps > L ? " (" + std::to_string(steps - L) + " steps after the schedule, at rate 0)"
                       : "") +
          "\n";
  return text;
}

}  // namespace meshtrain
