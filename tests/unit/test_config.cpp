// Config layering and its errors: presets, YAML files, overrides, unknown keys, duplicates, wrong types.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using testing::error_of;

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(Config, PresetThenOverrides) {
  const Config config =
      load_config("qwen3-0.6b", {"per_device_batch_size=2", "mesh.tensor=4", "kernels=fwd_bwd,update"});
  EXPECT_EQ(config.model_name, "qwen3-0.6b");
  EXPECT_EQ(config.base_emb_dim, 1024);
  EXPECT_EQ(config.per_device_batch_size, 2);
  EXPECT_EQ(config.mesh[MeshAxis::tensor], 4);
  EXPECT_EQ(config.kernels, (std::vector<std::string>{"fwd_bwd", "update"}));
  EXPECT_EQ(config.adam_b2, 0.95);  // from base.yaml
  EXPECT_EQ(config.resolved.size(), config_key_names().size());
}

TEST(Config, EveryPresetLoads) {
  const std::vector<std::string> presets = preset_names();
  for (const char* expected : {"qwen3-tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b",
                               "qwen3-32b", "gpt2-124m", "gpt2-350m", "deepseek-tiny"}) {
    EXPECT_NE(std::find(presets.begin(), presets.end(), expected), presets.end()) << expected;
    EXPECT_NO_THROW(load_config(expected, {})) << expected;
  }
}

TEST(Config, UserYamlLayersOverItsModelPreset) {
  const std::string path =
      write_temp("meshtrain_user.yaml", "model_name: gpt2-124m\nmax_target_length: 64\nmesh:\n  data: 2\n");
  const Config config = load_config(path, {"steps=5"});
  EXPECT_EQ(config.decoder_block, DecoderBlock::gpt2);
  EXPECT_EQ(config.max_target_length, 64);
  EXPECT_EQ(config.mesh[MeshAxis::data], 2);
  EXPECT_EQ(config.steps, 5);
}

// import-hf's config.yaml: a file that sets decoder_block describes its own model, so a model_name that is
// no preset names it; without decoder_block such a name is still refused as no preset.
TEST(Config, UserYamlThatDescribesItsModelMayNameIt) {
  const std::string own = write_temp("meshtrain_own_model.yaml",
                                     "model_name: qwen3_moe\ndecoder_block: qwen3\nbase_emb_dim: 32\n"
                                     "base_num_query_heads: 4\nbase_num_kv_heads: 2\nbase_mlp_dim: 64\n"
                                     "base_num_decoder_layers: 1\nvocab_size: 64\n");
  const Config config = load_config(own, {});
  EXPECT_EQ(config.model_name, "qwen3_moe");
  EXPECT_EQ(config.base_emb_dim, 32);
  EXPECT_EQ(config.steps, load_config("", {}).steps);  // base.yaml's: no preset under the file
  const std::string typo = write_temp("meshtrain_typo_model.yaml", "model_name: qwen3-tiniy\nsteps: 3\n");
  EXPECT_NE(error_of([&] { load_config(typo, {}); }).find("did you mean 'qwen3-tiny'"), std::string::npos);
}

TEST(Config, EnumKeysParseEveryValueByItsName) {
  for (DecoderBlock block : kDecoderBlocks) {
    EXPECT_EQ(
        load_config("qwen3-tiny", {std::string("decoder_block=") + decoder_block_name(block)}).decoder_block,
        block);
  }
  for (RematPolicy policy : kRematPolicies) {
    EXPECT_EQ(
        load_config("qwen3-tiny", {std::string("remat_policy=") + remat_policy_name(policy)}).remat_policy,
        policy);
  }
  for (DatasetType type : kDatasetTypes) {
    EXPECT_EQ(
        load_config("qwen3-tiny", {std::string("dataset_type=") + dataset_type_name(type)}).dataset_type,
        type);
  }
  // The resolved text stays the value as written (plan identity hashes it).
  const Config config = load_config("qwen3-tiny", {"remat_policy=full"});
  EXPECT_NE(std::find(config.resolved.begin(), config.resolved.end(),
                      std::pair<std::string, std::string>("remat_policy", "full")),
            config.resolved.end());
}

TEST(Config, UnknownEnumValueNamesTheKeyTheValuesAndTheClosest) {
  const std::string block = error_of([] { load_config("qwen3-tiny", {"decoder_block=qwen"}); });
  EXPECT_NE(block.find("'decoder_block'"), std::string::npos) << block;
  EXPECT_NE(block.find("qwen3, gpt2 or deepseek"), std::string::npos) << block;
  EXPECT_NE(block.find("did you mean 'qwen3'"), std::string::npos) << block;
  const std::string remat = error_of([] { load_config("qwen3-tiny", {"remat_policy=minimum"}); });
  EXPECT_NE(remat.find("'remat_policy' (command line)"), std::string::npos) << remat;
  EXPECT_NE(remat.find("none, minimal or full"), std::string::npos) << remat;
  EXPECT_NE(remat.find("did you mean 'minimal'"), std::string::npos) << remat;
  const std::string data = error_of([] { load_config("qwen3-tiny", {"dataset_type=token"}); });
  EXPECT_NE(data.find("'dataset_type'"), std::string::npos) << data;
  EXPECT_NE(data.find("text, tokens or synthetic"), std::string::npos) << data;
  EXPECT_NE(data.find("did you mean 'tokens'"), std::string::npos) << data;
}

// The pipeline keys (shared/specs/pipeline.md): defaults one stage, 1f1b, one chunk a rank, the default
// placement; every schedule by its name (torchtitan's, lower case); a split as a list in YAML's flow form or
// comma-separated; an unknown schedule names the four and the closest.
TEST(Config, PipelineKeysParseWithTheirDefaults) {
  const Config defaults = load_config("qwen3-tiny", {});
  EXPECT_EQ(defaults.mesh[MeshAxis::stage], 1);
  EXPECT_EQ(defaults.pipeline_schedule, PipelineScheduleKind::one_f_one_b);
  EXPECT_EQ(defaults.num_pipeline_repeats, 1);
  EXPECT_TRUE(defaults.pipeline_layers_per_chunk.empty());
  for (PipelineScheduleKind schedule : kPipelineScheduleKinds) {
    EXPECT_EQ(
        load_config("qwen3-tiny", {std::string("pipeline_schedule=") + pipeline_schedule_name(schedule)})
            .pipeline_schedule,
        schedule);
  }
  EXPECT_STREQ(pipeline_schedule_name(PipelineScheduleKind::interleaved_one_f_one_b), "interleaved_1f1b");
  const Config set = load_config(
      "qwen3-tiny", {"mesh.stage=-1", "num_pipeline_repeats=2", "pipeline_layers_per_chunk=[2, 1,1]"});
  EXPECT_EQ(set.mesh[MeshAxis::stage], -1);
  EXPECT_EQ(set.num_pipeline_repeats, 2);
  EXPECT_EQ(set.pipeline_layers_per_chunk, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(load_config("qwen3-tiny", {"pipeline_layers_per_chunk=3,4"}).pipeline_layers_per_chunk,
            (std::vector<int64_t>{3, 4}));
  const std::string schedule = error_of([] { load_config("qwen3-tiny", {"pipeline_schedule=1F1B"}); });
  EXPECT_NE(schedule.find("'pipeline_schedule' (command line)"), std::string::npos) << schedule;
  EXPECT_NE(schedule.find("gpipe, 1f1b, interleaved_1f1b or zero_bubble"), std::string::npos) << schedule;
  EXPECT_NE(schedule.find("did you mean '1f1b'"), std::string::npos) << schedule;
  const std::string split = error_of([] { load_config("qwen3-tiny", {"pipeline_layers_per_chunk=[2,x]"}); });
  EXPECT_NE(split.find("config key 'pipeline_layers_per_chunk'"), std::string::npos) << split;
  EXPECT_NE(split.find("an integer"), std::string::npos) << split;
  // In the resolved config (run_dir/config.yaml, checkpoints) after the mesh axes, mesh.stage in rank order.
  std::vector<std::string> keys;
  for (const auto& [key, value] : defaults.resolved) keys.push_back(key);
  const auto at = [&](const std::string& key) {
    return std::find(keys.begin(), keys.end(), key) - keys.begin();
  };
  EXPECT_EQ(at("mesh.stage"), at("mesh.data") + 1);
  EXPECT_EQ(at("mesh.fsdp"), at("mesh.stage") + 1);
  EXPECT_EQ(at("pipeline_schedule"), at("mesh.tensor") + 1);
  EXPECT_EQ(at("pipeline_layers_per_chunk"), at("num_pipeline_repeats") + 1);
}

TEST(Config, ContextParallelReorderDefaultsToDualChunkSwap) {
  const Config config = load_config("qwen3-tiny", {});
  EXPECT_TRUE(config.context_parallel_load_balance);
  EXPECT_EQ(config.context_parallel_reorder, ContextReorder::dual_chunk_swap);
  EXPECT_EQ(effective_context_reorder(config), ContextReorder::dual_chunk_swap);
  // Plan keys: under mesh.context > 1 the reorder decides each rank's rows and the strategy its ops, so a
  // plan file records them (tests/unit/plan/test_identity.cpp has the whole list).
  const std::vector<std::string> plan_keys = plan_key_names();
  for (const std::pair<std::string, std::string>& resolved :
       {std::pair<std::string, std::string>("context_parallel_load_balance", "true"),
        std::pair<std::string, std::string>("context_parallel_reorder", "dual_chunk_swap"),
        std::pair<std::string, std::string>("context_parallel_strategy", "all_gather")}) {
    EXPECT_NE(std::find(config.resolved.begin(), config.resolved.end(), resolved), config.resolved.end())
        << resolved.first;
    EXPECT_NE(std::find(plan_keys.begin(), plan_keys.end(), resolved.first), plan_keys.end())
        << resolved.first;
  }
}

TEST(Config, ContextParallelReorderParsesEachValueAndLoadBalanceOffMeansNone) {
  for (ContextReorder reorder : kContextParallelReorders) {
    const Config config =
        load_config("qwen3-tiny", {std::string("context_parallel_reorder=") + context_reorder_name(reorder)});
    EXPECT_EQ(config.context_parallel_reorder, reorder);
    EXPECT_EQ(effective_context_reorder(config), reorder);
  }
  for (const char* reorder : {"dual_chunk_swap", "striped"}) {
    const Config config = load_config("qwen3-tiny", {"context_parallel_load_balance=false",
                                                     std::string("context_parallel_reorder=") + reorder});
    EXPECT_FALSE(config.context_parallel_load_balance);
    EXPECT_EQ(effective_context_reorder(config), ContextReorder::none) << reorder;
  }
}

TEST(Config, UnknownContextParallelReorderNamesTheKeyTheValuesAndTheClosest) {
  const std::string typo = error_of([] { load_config("qwen3-tiny", {"context_parallel_reorder=stripe"}); });
  EXPECT_NE(typo.find("'context_parallel_reorder' (command line)"), std::string::npos) << typo;
  EXPECT_NE(typo.find("expected dual_chunk_swap or striped"), std::string::npos) << typo;
  EXPECT_NE(typo.find("did you mean 'striped'"), std::string::npos) << typo;
  // The plain split is the other key's job, and the error says which.
  const std::string none = error_of([] { load_config("qwen3-tiny", {"context_parallel_reorder=none"}); });
  EXPECT_NE(none.find("'context_parallel_reorder'"), std::string::npos) << none;
  EXPECT_NE(none.find("set context_parallel_load_balance=false"), std::string::npos) << none;
  const std::string flag = error_of([] { load_config("qwen3-tiny", {"context_parallel_load_balance=yes"}); });
  EXPECT_NE(flag.find("'context_parallel_load_balance'"), std::string::npos) << flag;
  EXPECT_NE(flag.find("true or false"), std::string::npos) << flag;
}

TEST(Config, ContextParallelStrategyIsAllGatherByDefaultOrRing) {
  EXPECT_EQ(load_config("qwen3-tiny", {}).context_parallel_strategy, ContextParallelStrategy::all_gather);
  EXPECT_EQ(load_config("qwen3-tiny", {"context_parallel_strategy=all_gather"}).context_parallel_strategy,
            ContextParallelStrategy::all_gather);
  EXPECT_EQ(load_config("qwen3-tiny", {"context_parallel_strategy=ring"}).context_parallel_strategy,
            ContextParallelStrategy::ring);
  const std::string typo =
      error_of([] { load_config("qwen3-tiny", {"context_parallel_strategy=allgather"}); });
  EXPECT_NE(typo.find("'context_parallel_strategy'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("all_gather"), std::string::npos) << typo;
}

TEST(Config, AttentionAndMoeKeysParseWithMaxTextDefaults) {
  const Config dense = load_config("qwen3-tiny", {});
  EXPECT_EQ(dense.attention_type, AttentionType::global);
  EXPECT_EQ(dense.q_lora_rank, 0);
  EXPECT_EQ(dense.kv_lora_rank, 512);
  EXPECT_EQ(dense.num_experts, 0);
  EXPECT_EQ(dense.n_routing_groups, 1);
  EXPECT_EQ(dense.mesh[MeshAxis::expert], 1);
  for (AttentionType type : kAttentionTypes) {
    EXPECT_EQ(load_config("deepseek-tiny", {std::string("attention_type=") + attention_type_name(type)})
                  .attention_type,
              type);
  }
  const Config moe = load_config(
      "deepseek-tiny",
      {"num_experts=8", "num_experts_per_tok=2", "base_moe_mlp_dim=64", "shared_experts=1",
       "routed_score_func=sigmoid", "routed_bias=true", "routed_bias_update_rate=0.001",
       "routed_scaling_factor=2.5", "norm_topk_prob=true", "n_routing_groups=4", "topk_routing_group=2",
       "capacity_factor=1.25", "load_balance_loss_weight=0.01", "first_num_dense_layers=1", "mesh.expert=2"});
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.num_experts_per_tok, 2);
  EXPECT_EQ(moe.routed_score_func, RoutedScoreFunc::sigmoid);
  EXPECT_TRUE(moe.routed_bias);
  EXPECT_EQ(moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(moe.capacity_factor, 1.25);
  EXPECT_EQ(moe.topk_routing_group, 2);
  EXPECT_EQ(moe.mesh[MeshAxis::expert], 2);
}

// Each bad value is refused when the config loads, naming the key, the values and the fix.
TEST(Config, BadMoeAndMlaValuesNameTheKeyTheValuesAndTheFix) {
  const std::vector<std::string> moe = {"num_experts=8", "base_moe_mlp_dim=64"};
  const auto error_with = [&](std::vector<std::string> overrides, bool with_moe = true) {
    if (with_moe) overrides.insert(overrides.begin(), moe.begin(), moe.end());
    // The preset has experts: a dense case says num_experts=0 unless it sets the key itself.
    const bool sets_experts = std::any_of(overrides.begin(), overrides.end(), [](const std::string& item) {
      return item.starts_with("num_experts=");
    });
    if (!with_moe && !sets_experts) overrides.insert(overrides.begin(), "num_experts=0");
    return error_of([&] { load_config("deepseek-tiny", overrides); });
  };
  ASSERT_EQ(error_with({}), "");
  struct Case {
    std::vector<std::string> overrides;
    bool with_moe;
    std::vector<std::string> expected;  // pieces of the message
  };
  const std::vector<Case> cases = {
      {{"num_experts_per_tok=9"}, true, {"'num_experts_per_tok'", "between 1 and num_experts (8)", "9"}},
      {{"n_routing_groups=3"}, true, {"'n_routing_groups'", "a divisor of num_experts (8)", "3"}},
      {{"n_routing_groups=4", "topk_routing_group=5"},
       true,
       {"'topk_routing_group'", "between 1 and n_routing_groups (4)", "5"}},
      {{"n_routing_groups=4", "topk_routing_group=1", "num_experts_per_tok=3"},
       true,
       {"'num_experts_per_tok'", "1 x 8 / 4 = 2", "3", "raise topk_routing_group"}},
      {{"mesh.expert=3"}, true, {"'mesh.expert'", "a divisor of num_experts (8)", "3"}},
      {{"mesh.expert=2"}, false, {"'mesh.expert'", "1 for a dense model", "set num_experts"}},
      {{"num_experts=8", "base_moe_mlp_dim=0"}, false, {"'base_moe_mlp_dim'", "a positive integer", "0"}},
      {{"num_experts=4", "decoder_block=gpt2", "attention_type=global"},
       false,
       {"'num_experts'", "0 for decoder_block=gpt2", "decoder_block=deepseek or qwen3"}},
      {{"qk_rope_head_dim=5"}, false, {"'qk_rope_head_dim'", "an even number", "5"}},
      {{"qk_rope_head_dim=0"},
       false,
       {"'qk_rope_head_dim'", "a positive integer under attention_type=mla", "0"}},
      {{"kv_lora_rank=0"}, false, {"'kv_lora_rank'", "a positive integer", "q_lora_rank=1536"}},
      {{"v_head_dim=49"},
       false,
       {"'v_head_dim'", "at most qk_nope_head_dim + qk_rope_head_dim (32 + 16)", "49"}},
      {{"decoder_block=qwen3"}, false, {"'attention_type'", "global for decoder_block=qwen3", "mla"}},
      {{"routed_score_func=softplus"}, false, {"'routed_score_func'", "softmax or sigmoid", "did you mean"}},
      {{"attention_type=latent"}, false, {"'attention_type'", "global or mla", "did you mean"}},
  };
  for (const Case& test : cases) {
    const std::string message = error_with(test.overrides, test.with_moe);
    SCOPED_TRACE(test.overrides.front());
    ASSERT_NE(message, "");
    for (const std::string& piece : test.expected)
      EXPECT_NE(message.find(piece), std::string::npos) << message;
  }
}

// Engram and mHC keys (issue 13's bad input), refused when the config loads: the key, expected vs found,
// and the fix.
TEST(Config, BadEngramAndMhcValuesNameTheKeyTheValuesAndTheFix) {
  const auto error_with = [](const std::vector<std::string>& overrides) {
    return error_of([&] { load_config("deepseek-custom-tiny", overrides); });
  };
  ASSERT_EQ(error_with({}), "");
  const Config custom = load_config("deepseek-custom-tiny", {"engram_layers=[4, 1]"});
  EXPECT_EQ(custom.engram_layers, (std::vector<int64_t>{4, 1}));  // YAML's flow list on the command line
  struct Case {
    std::vector<std::string> overrides;
    std::vector<std::string> expected;  // pieces of the message
  };
  const std::vector<Case> cases = {
      {{"engram_layers=[1,6]"}, {"'engram_layers'", "[0, base_num_decoder_layers) = [0, 6)", "found 6"}},
      {{"engram_layers=[-1]"}, {"'engram_layers'", "[0, 6)", "found -1"}},
      {{"engram_layers=[1,1]"}, {"'engram_layers'", "each layer at most once", "remove the repeated"}},
      {{"engram_max_ngram_size=1"}, {"'engram_max_ngram_size'", "at least 2", "found 1"}},
      {{"engram_max_ngram_size=4"}, {"'engram_vocab_bases'", "3 entries", "2 entries"}},
      {{"engram_vocab_bases=[16384,1]"}, {"'engram_vocab_bases'", "at least 2 rows", "order 3", "found 1"}},
      {{"engram_vocab_bases=[1200000000,1200000000]"}, {"'engram_vocab_bases'", "fit int32", "rows"}},
      {{"engram_num_heads=0"}, {"'engram_num_heads'", "a positive integer", "found 0"}},
      {{"engram_kernel_size=0"}, {"'engram_kernel_size'", "a positive integer", "found 0"}},
      {{"mhc_expansion_rate=0"}, {"'mhc_expansion_rate'", "1 (a plain residual) or more", "found 0"}},
      {{"sinkhorn_iterations=0"}, {"'sinkhorn_iterations'", "a positive number", "found 0"}},
      {{"engram_learning_rate_multiplier=-1"}, {"'engram_learning_rate_multiplier'", "0 or more"}},
  };
  for (const Case& test : cases) {
    const std::string message = error_with(test.overrides);
    SCOPED_TRACE(test.overrides.front());
    ASSERT_NE(message, "");
    for (const std::string& piece : test.expected)
      EXPECT_NE(message.find(piece), std::string::npos) << message;
  }
  // Built by decoder_block=deepseek only.
  const std::string qwen3 = error_of([] { load_config("qwen3-tiny", {"engram_layers=[0]"}); });
  EXPECT_NE(qwen3.find("Engram blocks are built by decoder_block=deepseek"), std::string::npos) << qwen3;
  const std::string gpt2 = error_of([] { load_config("gpt2-124m", {"mhc_expansion_rate=4"}); });
  EXPECT_NE(gpt2.find("mHC hyper-connections are built by decoder_block=deepseek"), std::string::npos)
      << gpt2;
}

TEST(Config, UnknownKeySuggestsTheClosest) {
  const std::string message = error_of([] { load_config("qwen3-tiny", {"per_device_batchsize=2"}); });
  EXPECT_NE(message.find("per_device_batchsize"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'per_device_batch_size'"), std::string::npos) << message;
}

TEST(Config, UnknownPresetSuggestsTheClosest) {
  const std::string message = error_of([] { load_config("qwen3-0.6", {}); });
  EXPECT_NE(message.find("did you mean 'qwen3-0.6b'"), std::string::npos) << message;
}

// Found by tests/fuzz/fuzz_config: a name longer than a file name can be made std::filesystem throw
// (ENAMETOOLONG) instead of the error naming the preset or file.
TEST(Config, OverlongPresetOrFileNameIsAnErrorNamingIt) {
  const std::string long_name(300, 'q');
  const std::string preset = error_of([&] { load_config(long_name, {}); });
  EXPECT_NE(preset.find("config '" + long_name + "'"), std::string::npos) << preset;
  EXPECT_NE(preset.find("no preset of that name (File name too long)"), std::string::npos) << preset;
  const std::string path = write_temp("meshtrain_long_preset.yaml", "model_name: " + long_name + "\n");
  EXPECT_NE(error_of([&] { load_config(path, {}); }).find("no preset of that name"), std::string::npos);
  const std::string file = "/tmp/" + long_name + ".yaml";
  const std::string message = error_of([&] { load_config(file, {}); });
  EXPECT_NE(message.find(file + ": expected a readable YAML config file, found File name too long"),
            std::string::npos)
      << message;
}

// Found by tests/fuzz/fuzz_config: a list holding a mapping ("[1, : ]") or a key that is itself a sequence
// escaped as a yaml-cpp exception and terminated the process.
TEST(Config, NestedListElementOrNonScalarKeyIsAnErrorNamingIt) {
  const std::string list =
      write_temp("meshtrain_nested_list.yaml", "model_name: qwen3-tiny\nsteps: [1, : ]\n");
  const std::string message = error_of([&] { load_config(list, {}); });
  EXPECT_NE(message.find("config key 'steps' at " + list + ":2"), std::string::npos) << message;
  EXPECT_NE(message.find("a nested sequence or mapping in the list"), std::string::npos) << message;
  const std::string key =
      write_temp("meshtrain_sequence_key.yaml", "model_name: qwen3-tiny\n? [a, b]\n: 3\n");
  const std::string key_message = error_of([&] { load_config(key, {}); });
  EXPECT_NE(key_message.find("a config key at " + key + ":2"), std::string::npos) << key_message;
  // A missing file or preset keeps the plain wording (not the OS's "No such file or directory").
  EXPECT_NE(
      error_of([] { load_config("/tmp/meshtrain_no_such_config.yaml", {}); }).find("found no such file"),
      std::string::npos);
  EXPECT_NE(error_of([] { load_config("qwen3-0.6", {}); }).find("found no preset of that name (fix:"),
            std::string::npos);
}

// dataset_path takes a list of mappings (its mixture, data/mixture.h): it arrives as JSON text, every value a
// string; a list of plain values keeps its old meaning, and any other key still refuses mappings.
TEST(Config, DatasetPathCarriesAYamlListOfMappingsAsJson) {
  const std::string mixture =
      write_temp("meshtrain_mixture.yaml",
                 "model_name: qwen3-tiny\ndataset_path:\n  - {path: data/web, weight: 0.7}\n"
                 "  - path: data/code\n    weight: 0.3\n");
  EXPECT_EQ(load_config(mixture, {}).dataset_path,
            R"([{"path":"data/web","weight":"0.7"},{"path":"data/code","weight":"0.3"}])");
  const std::string plain =
      write_temp("meshtrain_plain_list.yaml", "model_name: qwen3-tiny\ndataset_path: [a, b]\n");
  EXPECT_EQ(load_config(plain, {}).dataset_path, "a,b");
  const std::string nested =
      write_temp("meshtrain_nested_mixture.yaml",
                 "model_name: qwen3-tiny\ndataset_path:\n  - {path: [a, b], weight: 1}\n");
  const std::string message = error_of([&] { load_config(nested, {}); });
  EXPECT_NE(message.find("config key 'dataset_path' at " + nested + ":2"), std::string::npos) << message;
  EXPECT_NE(message.find("a nested sequence or mapping in one"), std::string::npos) << message;
  const std::string other = write_temp("meshtrain_mapping_list.yaml",
                                       "model_name: qwen3-tiny\ntokenizer_path:\n  - {path: a, weight: 1}\n");
  EXPECT_NE(error_of([&] { load_config(other, {}); }).find("a nested sequence or mapping in the list"),
            std::string::npos);
}

TEST(Config, SameKeyTwiceWithDifferentValuesIsAnError) {
  EXPECT_NE(error_of([] {
              load_config("qwen3-tiny", {"steps=3", "steps=4"});
            }).find("steps"),
            std::string::npos);
  EXPECT_NO_THROW(load_config("qwen3-tiny", {"steps=3", "steps=3"}));
  const std::string path = write_temp("meshtrain_twice.yaml", "model_name: qwen3-tiny\nsteps: 3\nsteps: 4\n");
  const std::string message = error_of([&] { load_config(path, {}); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("steps"), std::string::npos) << message;
}

TEST(Config, WrongTypeNamesKeyAndExpectedType) {
  const std::string message = error_of([] { load_config("qwen3-tiny", {"steps=ten"}); });
  EXPECT_NE(message.find("'steps'"), std::string::npos) << message;
  EXPECT_NE(message.find("an integer"), std::string::npos) << message;
  EXPECT_NE(error_of([] { load_config("qwen3-tiny", {"packing=maybe"}); }).find("true or false"),
            std::string::npos);
  const std::string shuffling = error_of([] { load_config("qwen3-tiny", {"enable_data_shuffling=maybe"}); });
  EXPECT_NE(shuffling.find("'enable_data_shuffling'"), std::string::npos) << shuffling;
  EXPECT_NE(shuffling.find("true or false"), std::string::npos) << shuffling;
  EXPECT_TRUE(load_config("qwen3-tiny", {}).enable_data_shuffling);  // base.yaml: shuffled
  EXPECT_FALSE(load_config("qwen3-tiny", {"enable_data_shuffling=false"}).enable_data_shuffling);
  EXPECT_NE(error_of([] { load_config("qwen3-tiny", {"dtype=float8"}); }).find("float32 or bfloat16"),
            std::string::npos);
}

TEST(Config, ZLossMultiplierIsOffByDefaultAndNeverNegative) {
  EXPECT_EQ(load_config("qwen3-tiny", {}).z_loss_multiplier, 0.0);
  EXPECT_EQ(load_config("qwen3-tiny", {"z_loss_multiplier=1e-4"}).z_loss_multiplier, 1e-4);
  for (const char* bad : {"z_loss_multiplier=-1e-4", "z_loss_multiplier=inf", "z_loss_multiplier=nan"}) {
    const std::string message = error_of([&] { load_config("qwen3-tiny", {bad}); });
    EXPECT_NE(message.find("config key 'z_loss_multiplier'"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find("0 (no z-loss) or a positive finite multiplier"), std::string::npos) << message;
    EXPECT_NE(message.find("set z_loss_multiplier=0"), std::string::npos) << message;
  }
}

TEST(Config, ClosestNameUsesEditDistance) {
  EXPECT_EQ(closest_name("lerning_rate", {"learning_rate", "steps", "adam_b1"}), "learning_rate");
}

}  // namespace
}  // namespace meshtrain
