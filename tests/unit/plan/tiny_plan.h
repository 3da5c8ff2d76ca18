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

// A two-layer DeepSeek-style model (deepseek-custom-tiny shrunk): MLA, a dense layer then an MoE layer (with
// its selection bias), Engram on both layers and two mHC streams.
inline Config tiny_deepseek_config(const std::vector<std::string>& extra = {}) {
  return load_config("deepseek-custom-tiny", with_overrides({"base_emb_dim=32",
                                                             "base_num_query_heads=2",
                                                             "base_num_kv_heads=2",
                                                             "base_mlp_dim=48",
                                                             "base_num_decoder_layers=2",
                                                             "kv_lora_rank=8",
                                                             "qk_nope_head_dim=8",
                                                             "qk_rope_head_dim=4",
                                                             "v_head_dim=8",
                                                             "q_lora_rank=8",
                                                             "num_experts=4",
                                                             "base_moe_mlp_dim=16",
                                                             "engram_layers=[0,1]",
                                                             "engram_num_heads=2",
                                                             "engram_head_dim=4",
                                                             "engram_vocab_bases=[31,37]",
                                                             "engram_kernel_size=2",
                                                             "mhc_expansion_rate=2",
                                                             "vocab_size=100",
                                                             "max_target_length=16",
                                                             "per_device_batch_size=2",
                                                             "dataset_type=synthetic",
                                                             "tokenizer_path="},
                                                            extra));
}

inline TrainingPlan tiny_plan(const std::vector<std::string>& extra = {}) {
  PlanRequest request;
  request.config = tiny_config(extra);
  return plan_training(request);
}

}  // namespace meshtrain::testing
