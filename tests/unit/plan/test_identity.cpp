// Plan identity: the config table's plan keys in their recorded order, then the derived inputs; the hash
// moves with a plan key and not with any other key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "meshtrain/plan/passes.h"
#include "tiny_plan.h"

namespace meshtrain {
namespace {

TEST(PlanIdentity, KeysComeFromTheConfigTableInPlanFileOrder) {
  // The order plan files have always recorded (their bytes depend on it).
  const std::vector<std::string> expected = {"decoder_block",
                                             "base_emb_dim",
                                             "base_num_query_heads",
                                             "base_num_kv_heads",
                                             "head_dim",
                                             "base_mlp_dim",
                                             "base_num_decoder_layers",
                                             "vocab_size",
                                             "max_position_embeddings",
                                             "logits_via_embedding",
                                             "attention_type",
                                             "q_lora_rank",
                                             "kv_lora_rank",
                                             "qk_nope_head_dim",
                                             "qk_rope_head_dim",
                                             "v_head_dim",
                                             "num_experts",
                                             "num_experts_per_tok",
                                             "base_moe_mlp_dim",
                                             "first_num_dense_layers",
                                             "shared_experts",
                                             "routed_bias",
                                             "n_routing_groups",
                                             "topk_routing_group",
                                             "capacity_factor",
                                             "engram_layers",
                                             "engram_max_ngram_size",
                                             "engram_num_heads",
                                             "engram_head_dim",
                                             "engram_vocab_bases",
                                             "engram_kernel_size",
                                             "mhc_expansion_rate",
                                             "sinkhorn_iterations",
                                             "max_target_length",
                                             "dtype",
                                             "weight_dtype",
                                             "grad_dtype",
                                             "mu_dtype",
                                             "remat_policy",
                                             "scan_layers",
                                             "per_device_batch_size",
                                             "gradient_accumulation_steps",
                                             "shard_optimizer_over_data",
                                             "context_parallel_load_balance",
                                             "context_parallel_reorder",
                                             "context_parallel_strategy",
                                             "logical_axis_rules.batch",
                                             "logical_axis_rules.length",
                                             "logical_axis_rules.embed",
                                             "logical_axis_rules.heads",
                                             "logical_axis_rules.kv_heads",
                                             "logical_axis_rules.head_dim",
                                             "logical_axis_rules.mlp",
                                             "logical_axis_rules.vocab",
                                             "logical_axis_rules.positions",
                                             "logical_axis_rules.experts",
                                             "logical_axis_rules.engram_rows"};
  EXPECT_EQ(plan_key_names(), expected);
  const TrainingPlan plan = testing::tiny_plan({"mesh.data=2"});
  std::vector<std::string> keys;
  for (const auto& [key, value] : plan.identity.keys) keys.push_back(key);
  std::vector<std::string> with_derived = expected;
  for (const char* derived :
       {"topology", "mesh.data", "mesh.fsdp", "mesh.context", "mesh.expert", "mesh.tensor", "threads"})
    with_derived.push_back(derived);
  EXPECT_EQ(keys, with_derived);
  EXPECT_EQ(plan.identity.keys[1], (std::pair<std::string, std::string>{"base_emb_dim", "32"}));
}

TEST(PlanIdentity, HashMovesWithPlanKeysOnly) {
  const Mesh mesh = resolve_mesh(MeshShape{}, 1, "test");
  const Topology topology = load_topology("cpu", "");
  const std::string base = plan_identity(testing::tiny_config(), mesh, topology, 1).hash;
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(plan_identity(testing::tiny_config(), mesh, topology, 1).hash, base);
  EXPECT_EQ(plan_identity(testing::tiny_config({"learning_rate=0.5"}), mesh, topology, 1).hash, base);
  EXPECT_NE(plan_identity(testing::tiny_config({"remat_policy=full"}), mesh, topology, 1).hash, base);
  // The context-parallel keys decide each context rank's rows (and, for the strategy, its attention ops).
  EXPECT_NE(plan_identity(testing::tiny_config({"context_parallel_reorder=striped"}), mesh, topology, 1).hash,
            base);
  EXPECT_NE(
      plan_identity(testing::tiny_config({"context_parallel_load_balance=false"}), mesh, topology, 1).hash,
      base);
  EXPECT_NE(plan_identity(testing::tiny_config(), mesh, topology, 2).hash, base);
}

// The pipeline keys and the stage axis are plan inputs only under stages: a one-stage identity is the one
// of before they existed (the keys above; plan files made then stay valid), whatever they say, and one with
// stages lists them (the schedule and the placement decide its plan) and moves with each.
TEST(PlanIdentity, PipelineKeysAndTheStageAxisCountOnlyUnderStages) {
  const Topology topology = load_topology("cpu", "");
  const Mesh one_stage = resolve_mesh(MeshShape{}, 1, "test");
  const std::string base = plan_identity(testing::tiny_config(), one_stage, topology, 1).hash;
  for (const char* key :
       {"pipeline_schedule=gpipe", "num_pipeline_repeats=2", "pipeline_layers_per_chunk=[2]"})
    EXPECT_EQ(plan_identity(testing::tiny_config({key}), one_stage, topology, 1).hash, base) << key;
  const Mesh stages({{MeshAxis::stage, 2}});
  const PlanIdentity staged = plan_identity(testing::tiny_config(), stages, topology, 1);
  std::vector<std::string> keys;
  for (const auto& [key, value] : staged.keys) keys.push_back(key);
  const std::vector<std::string> expected_tail = {"logical_axis_rules.engram_rows",
                                                  "pipeline_schedule",
                                                  "num_pipeline_repeats",
                                                  "pipeline_layers_per_chunk",
                                                  "topology",
                                                  "mesh.data",
                                                  "mesh.stage",
                                                  "mesh.fsdp",
                                                  "mesh.context",
                                                  "mesh.expert",
                                                  "mesh.tensor",
                                                  "threads"};
  ASSERT_GE(keys.size(), expected_tail.size());
  EXPECT_EQ(
      std::vector<std::string>(keys.end() - static_cast<std::ptrdiff_t>(expected_tail.size()), keys.end()),
      expected_tail);
  EXPECT_NE(staged.hash, base);
  for (const char* key :
       {"pipeline_schedule=gpipe", "num_pipeline_repeats=2", "pipeline_layers_per_chunk=[1,1]"})
    EXPECT_NE(plan_identity(testing::tiny_config({key}), stages, topology, 1).hash, staged.hash) << key;
}

// Under mesh.context > 1 a plan file made for one reorder is refused by a run with another, naming the key.
TEST(PlanIdentity, APlanFileOfAnotherContextReorderIsRefusedNamingTheKey) {
  namespace fs = std::filesystem;
  const auto plan_on_two = [](const std::vector<std::string>& extra) {
    PlanRequest request;
    request.config = testing::tiny_config(extra);
    request.kernels = {KernelName::fwd_bwd};
    request.devices = 2;
    return plan_training(request);
  };
  const fs::path dir = fs::temp_directory_path() / "meshtrain_identity_context_reorder";
  fs::create_directories(dir);
  const std::string stem = (dir / "plan").string();
  const TrainingPlan dual = plan_on_two({"mesh.context=2"});
  std::ofstream(plan_file_path(stem, KernelName::fwd_bwd))
      << serialize_kernel_plan(dual, KernelName::fwd_bwd);
  EXPECT_NO_THROW(verify_plan_file(dual, KernelName::fwd_bwd, stem));
  for (const char* other : {"context_parallel_reorder=striped", "context_parallel_load_balance=false"}) {
    const TrainingPlan plan = plan_on_two({"mesh.context=2", other});
    const std::string mismatch =
        testing::error_of([&] { verify_plan_file(plan, KernelName::fwd_bwd, stem); });
    const std::string key = std::string(other).substr(0, std::string(other).find('='));
    EXPECT_NE(mismatch.find("a plan for this run (" + std::string(other) + ")"), std::string::npos)
        << mismatch;
    EXPECT_NE(mismatch.find("a plan made with " + key + "="), std::string::npos) << mismatch;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
