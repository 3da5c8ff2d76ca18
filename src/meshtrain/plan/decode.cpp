// Planning the decode program (see decode.h).
#include "meshtrain/plan/decode.h"

#include "meshtrain/core/error.h"

namespace meshtrain {

TrainingPlan plan_decode(const Config& config, int64_t cache_length) {
  MT_CHECK(cache_length > 0, "a decode plan needs a cache of at least one row");
  PlanRequest request;
  request.config = config;
  // Decoding runs on this host's cpu kernels whatever the run trained on (the cuda backend has no decode
  // kernels yet), so a checkpoint trained on a GPU samples anywhere.
  request.config.topology = "cpu";
  request.devices = 1;
  request.decode_cache_length = cache_length;
  return plan_training(request);
}

}  // namespace meshtrain
