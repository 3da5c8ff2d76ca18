// The decode program's plan: the decode spec (the model's layers at one token, attention through key / value
// caches) planned by the same plan_training() as the training kernels, as one `decode` kernel.
#pragma once

#include <cstdint>

#include "meshtrain/plan/plan.h"

namespace meshtrain {

// One process on `config`'s (cpu) topology, caches of `cache_length` rows (>= 1). Persistent buffers are the
// parameter values, the caches and the step's tokens and positions: no gradient, moment or loss exists.
TrainingPlan plan_decode(const Config& config, int64_t cache_length);

}  // namespace meshtrain
