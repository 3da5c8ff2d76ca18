// A small qwen3 planned on a cpu mesh, for the tests of the planner's passes.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain::testing {

// `overrides` with each of `extra` added, or replacing the item of the same key (a key twice is a config
// error).
inline std::vector<std::string> with_overrides(std::vector<std::string> overrides,
                                               const std::vector<std::string>& extra) {
  for (const std::string& item : extra) {
    const std::string key = item.substr(0, item.find('=') + 1);
    std::erase_if(overrides, [&](const std::string& existing) { return existing.starts_with(key); });
    overrides.push_back(item);
  }
  return overrides;
}

// qwen3-tiny shrunk to two layers of width 32; `extra` adds keys ("mesh.data=2") or replaces these.
inline Config tiny_config(const std::vector<std::string>& extra = {}) {
  return load_config("qwen3-tiny",
                     with_overrides({"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2",
                                     "head_dim=8", "base_mlp_dim=48", "base_num_decoder_layers=2",
                                     "vocab_size=100", "max_target_length=16", "per_device_batch_size=2",
                                     "dataset_type=synthetic", "tokenizer_path="},
                                    extra));
}

inline TrainingPlan tiny_plan(const std::vector<std::string>& extra = {}) {
  PlanRequest request;
  request.config = tiny_config(extra);
  return plan_training(request);
}

}  // namespace meshtrain::testing
