// Learning-rate schedule: linear warmup to the peak, then cosine decay to a final fraction of it.
#pragma once

#include <cstdint>

#include "meshtrain/config/config.h"

namespace meshtrain {

// Learning rate of optimizer step `step` (0-based) of config.steps.
double learning_rate_at(const Config& config, int64_t step);

}  // namespace meshtrain
