#include "meshtrain/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace meshtrain {

double learning_rate_at(const Config& config, int64_t step) {
  const double peak = config.learning_rate;
  const double total = static_cast<double>(std::max<int64_t>(config.steps, 1));
  const double warmup = std::floor(config.warmup_steps_fraction * total);
  const double position = static_cast<double>(step);
  // Warmup starts above zero so that step 0 already moves the weights.
  if (position < warmup) return peak * (position + 1.0) / (warmup + 1.0);
  const double progress = std::min(1.0, (position - warmup) / std::max(1.0, total - warmup));
  const double final_fraction = config.cosine_learning_rate_final_fraction;
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return peak * (final_fraction + (1.0 - final_fraction) * cosine);
}

}  // namespace meshtrain
