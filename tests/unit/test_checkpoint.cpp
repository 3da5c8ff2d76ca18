// Tests for checkpoints: bitwise round trips, crash consistency (SIGKILL at each phase of a save, in a forked
// child), a full disk during a save, corrupted or mismatched checkpoints, and retention (keep_last).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::vector<std::string> tiny_overrides(const std::string& emb_dim = "32", const std::string& vocab = "100") {
  return {
      "base_emb_dim=" + emb_dim, "base_num_query_heads=4",    "base_num_kv_heads=2", "head_dim=8",
      "base_mlp_dim=48",         "base_num_decoder_layers=2", "vocab_size=" + vocab, "max_target_length=8",
      "per_device_batch_size=2"};
}

Engine make_engine(const std::string& emb_dim = "32", const std::string& vocab = "100") {
  return Engine(load_config("qwen3-tiny", tiny_overrides(emb_dim, vocab)));
}

// A parameter's value (tensor 0) and its optimizer moments (1: adam_m, 2: adam_v), as a checkpoint holds
// them.
BufferId tensor_of(const Engine& engine, size_t p, int tensor) {
  return tensor == 0 ? engine.spec().parameters[p].value
                     : engine.plan().optimizer.state(p).moments.at(static_cast<size_t>(tensor - 1));
}

// Every parameter and moment gets values distinct per buffer, element and `salt`.
void fill_engine(Engine& engine, float salt) {
  int buffer_index = 0;
  for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {
    for (int tensor = 0; tensor < 3; ++tensor) {
      const BufferId id = tensor_of(engine, p, tensor);
      const TensorView view = engine.view(id);
      float* data = view.f32();
      for (int64_t i = 0; i < view.elements(); ++i) {
        data[i] = salt + static_cast<float>(buffer_index) * 0.001f + static_cast<float>(i) * 1e-6f;
      }
      ++buffer_index;
    }
  }
}

std::vector<char> buffer_bytes(const Engine& engine, BufferId id) {
  const TensorView view = engine.view(id);
  const char* data = static_cast<const char*>(view.data);
  return std::vector<char>(data, data + view.bytes());
}

// Whether the two engines hold bitwise equal parameters (and moments if `moments`).
bool same_state(const Engine& a, const Engine& b, bool moments) {
  for (size_t i = 0; i < a.spec().parameters.size(); ++i) {
    for (int tensor = 0; tensor < (moments ? 3 : 1); ++tensor) {
      if (buffer_bytes(a, tensor_of(a, i, tensor)) != buffer_bytes(b, tensor_of(b, i, tensor))) return false;
    }
  }
  return true;
}

CheckpointState state_at(int64_t step) {
  CheckpointState state;
  state.step = step;
  state.data_cursor = {{"file", 3}, {"offset", 1000 + step}};
  state.rng = {{"seed", 7}, {"counter", step * 2}};
  return state;
}

std::string step_dir(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_checkpoint_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string root() const { return (dir_ / "checkpoints").string(); }
  std::vector<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(root())) names.insert(entry.path().filename().string());
    return {names.begin(), names.end()};
  }
  // The MeshError message of `action`, or "" when it did not throw one.
  template <class Action>
  static std::string error_of(Action action) {
    try {
      action();
    } catch (const MeshError& error) {
      return error.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripIsBitwiseExact) {
  Engine saved = make_engine();
  fill_engine(saved, 0.5f);
  const std::string tokenizer = (dir_ / "tokenizer.json").string();
  std::ofstream(tokenizer) << "{\"model\": {}}";
  CheckpointOptions options;
  options.tokenizer_path = tokenizer;
  options.tokenizer_identity = "tok-v1";
  const std::string path = save_checkpoint(root(), saved, state_at(12), options);
  EXPECT_EQ(path, (fs::path(root()) / step_dir(12)).string());
  EXPECT_EQ(latest_checkpoint(root()), path);
  for (const char* file :
       {"index.json", "shards/rank_00000.safetensors", "tokenizer.json", "metadata.json", "COMMITTED"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(path) / file)) << file;
  }
  EXPECT_FALSE(fs::exists(fs::path(path) / "shards/rank_00000.json"));  // merged into index.json
  EXPECT_EQ(entries(), std::vector<std::string>{step_dir(12)});

  const nlohmann::json metadata = nlohmann::json::parse(std::ifstream(fs::path(path) / "metadata.json"));
  EXPECT_EQ(metadata.at("format_version"), kCheckpointFormatVersion);
  EXPECT_EQ(metadata.at("step"), 12);
  EXPECT_EQ(metadata.at("scan_layers"), false);
  EXPECT_EQ(metadata.at("param_scan_axis"), 1);
  EXPECT_EQ(metadata.at("mesh").at("fsdp"), saved.spec().config.mesh[MeshAxis::fsdp]);
  EXPECT_EQ(metadata.at("config").at("base_emb_dim"), "32");
  EXPECT_EQ(metadata.at("tokenizer").at("identity"), "tok-v1");
  EXPECT_TRUE(metadata.at("files").contains("tokenizer.json"));
  EXPECT_TRUE(metadata.at("files").contains("index.json"));
  EXPECT_FALSE(
      metadata.at("files").contains("shards/rank_00000.safetensors"));  // its chunks carry their CRCs
  EXPECT_TRUE(metadata.contains("meshtrain_version"));

  Engine loaded = make_engine();
  fill_engine(loaded, -3.0f);
  EXPECT_FALSE(same_state(saved, loaded, true));
  const CheckpointState state = load_checkpoint(path, loaded, false, "tok-v1");
  EXPECT_TRUE(same_state(saved, loaded, true));
  EXPECT_EQ(state.step, 12);
  EXPECT_EQ(state.data_cursor, state_at(12).data_cursor);
  EXPECT_EQ(state.rng, state_at(12).rng);

  // parameters_only: parameters replaced, moments left as they were, fresh state.
  Engine fresh = make_engine();
  fill_engine(fresh, -3.0f);
  Engine untouched = make_engine();
  fill_engine(untouched, -3.0f);
  const CheckpointState fresh_state = load_checkpoint(path, fresh, true);
  EXPECT_EQ(fresh_state.step, 0);
  EXPECT_TRUE(fresh_state.data_cursor.is_null());
  for (size_t i = 0; i < fresh.spec().parameters.size(); ++i) {
    const ParameterDecl& p = fresh.spec().parameters[i];
    EXPECT_EQ(buffer_bytes(fresh, p.value), buffer_bytes(saved, p.value));
    for (int moment = 1; moment < 3; ++moment) {
      EXPECT_EQ(buffer_bytes(fresh, tensor_of(fresh, i, moment)),
                buffer_bytes(untouched, tensor_of(untouched, i, moment)));
    }
  }
}

// Under opt_type=muon a hidden matrix keeps Muon's one moment (muon_mu/) and the rest AdamW's two: they round
// trip; a state of the other optimizer is refused naming opt_type and both values; its parameters load.
TEST_F(CheckpointTest, MuonMomentsRoundTripAndTheOtherOptimizersStateIsRefused) {
  const auto engine_of = [](const std::string& optimizer) {
    std::vector<std::string> overrides = tiny_overrides("32", "100");
    overrides.push_back("opt_type=" + optimizer);
    return Engine(load_config("qwen3-tiny", overrides));
  };
  // Every value and moment of `engine`, by buffer, filled distinctly; or read back.
  const auto fill = [](Engine& engine, float salt) {
    for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {
      std::vector<BufferId> ids = engine.plan().optimizer.state(p).moments;
      ids.push_back(engine.spec().parameters[p].value);
      for (BufferId id : ids) {
        const TensorView view = engine.view(id);
        for (int64_t i = 0; i < view.elements(); ++i)
          view.f32()[i] = salt + static_cast<float>(id) * 0.001f + static_cast<float>(i) * 1e-6f;
      }
    }
  };
  const auto state_bytes = [](const Engine& engine) {
    std::vector<std::vector<char>> bytes;
    for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {
      bytes.push_back(buffer_bytes(engine, engine.spec().parameters[p].value));
      for (BufferId id : engine.plan().optimizer.state(p).moments) bytes.push_back(buffer_bytes(engine, id));
    }
    return bytes;
  };
  Engine saved = engine_of("muon");
  size_t muon_parameters = 0;
  for (size_t p = 0; p < saved.spec().parameters.size(); ++p)
    muon_parameters += saved.plan().optimizer.state(p).muon;
  EXPECT_EQ(muon_parameters, 14u);  // 2 layers x (4 attention + 3 MLP matrices)
  fill(saved, 0.25f);
  const std::string path = save_checkpoint(root(), saved, state_at(3), CheckpointOptions{});
  std::ifstream index_file(fs::path(path) / "index.json");
  const std::string index((std::istreambuf_iterator<char>(index_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(index.find("muon_mu/decoder/layers_0/mlp/wo/kernel"), std::string::npos);
  EXPECT_EQ(index.find("adam_m/decoder/layers_0/mlp/wo/kernel"), std::string::npos);
  EXPECT_NE(index.find("adam_m/decoder/decoder_norm/scale"), std::string::npos);

  Engine loaded = engine_of("muon");
  fill(loaded, -2.0f);
  EXPECT_NE(state_bytes(loaded), state_bytes(saved));
  load_checkpoint(path, loaded, false);
  EXPECT_EQ(state_bytes(loaded), state_bytes(saved));

  Engine adamw = engine_of("adamw");
  const std::string refused = error_of([&] { load_checkpoint(path, adamw, false); });
  EXPECT_NE(refused.find("opt_type"), std::string::npos) << refused;
  EXPECT_NE(refused.find("adamw (this run's opt_type)"), std::string::npos) << refused;
  EXPECT_NE(refused.find("found muon"), std::string::npos) << refused;
  EXPECT_NE(refused.find("load_parameters_path="), std::string::npos) << refused;
  EXPECT_EQ(error_of([&] { load_checkpoint(path, adamw, true); }), "");  // its parameters load

  fill(adamw, 1.0f);
  const std::string adamw_path = save_checkpoint(root(), adamw, state_at(4), CheckpointOptions{});
  EXPECT_NE(error_of([&] { load_checkpoint(adamw_path, loaded, false); }).find("found adamw"),
            std::string::npos);
}

// A layer's value or moment as `engine` holds it: its own tensor, or its block of a stacked one.
std::vector<char> layer_bytes(const Engine& engine, const std::string& canonical, int moment) {
  for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {
    const ParameterDecl& parameter = engine.spec().parameters[p];
    const BufferId whole = tensor_of(engine, p, moment);
    if (!parameter.stacked()) {
      if (parameter.canonical_name == canonical) return buffer_bytes(engine, whole);
      continue;
    }
    for (size_t i = 0; i < parameter.members.size(); ++i) {
      if (parameter.members[i].canonical_name != canonical) continue;
      const std::vector<char> all = buffer_bytes(engine, whole);
      const size_t block = all.size() / parameter.members.size();
      return {all.begin() + static_cast<std::ptrdiff_t>(i * block),
              all.begin() + static_cast<std::ptrdiff_t>((i + 1) * block)};
    }
  }
  ADD_FAILURE() << "no tensor " << canonical;
  return {};
}

// Every per-layer tensor of `per_layer` (the canonical names) equal in `other`, moments too.
void expect_same_layers(const Engine& per_layer, const Engine& other, const std::string& what) {
  for (const ParameterDecl& parameter : per_layer.spec().parameters) {
    for (int moment = 0; moment < 3; ++moment) {
      EXPECT_EQ(layer_bytes(per_layer, parameter.canonical_name, 0 + moment),
                layer_bytes(other, parameter.canonical_name, moment))
          << parameter.canonical_name << " moment " << moment << ": " << what;
    }
  }
}

// layers-and-checkpoints.md: a stacked checkpoint loads into a per-layer run and back, whatever either's
// param_scan_axis; the stacked tensors keep the layer axis at param_scan_axis (format 2's single file is
// tests/reference/checkpoint_v2's fixture).
TEST_F(CheckpointTest, LayoutsConvertBothWays) {
  // Three layers unless `extra` says otherwise.
  const auto engine_with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> keys;
    for (const std::string& key : tiny_overrides()) {
      if (!key.starts_with("base_num_decoder_layers=")) keys.push_back(key);
    }
    keys.insert(keys.end(), extra.begin(), extra.end());
    if (std::none_of(extra.begin(), extra.end(),
                     [](const std::string& key) { return key.starts_with("base_num_decoder_layers="); }))
      keys.push_back("base_num_decoder_layers=3");
    return Engine(load_config("qwen3-tiny", keys));
  };
  Engine per_layer = engine_with({});
  fill_engine(per_layer, 0.25f);
  const std::string per_layer_path = save_checkpoint(root(), per_layer, state_at(1), {});
  for (const std::string axis : {"0", "1", "3"}) {
    Engine stacked = engine_with({"scan_layers=true", "param_scan_axis=" + axis});
    fill_engine(stacked, -1.0f);
    load_checkpoint(per_layer_path, stacked, false);
    expect_same_layers(per_layer, stacked, "per layer -> stacked at axis " + axis);

    const std::string stacked_path =
        save_checkpoint((dir_ / ("stacked_" + axis)).string(), stacked, state_at(2), {});
    const nlohmann::json metadata =
        nlohmann::json::parse(std::ifstream(fs::path(stacked_path) / "metadata.json"));
    EXPECT_EQ(metadata.at("scan_layers"), true);
    EXPECT_EQ(metadata.at("param_scan_axis"), std::stoi(axis));
    // The stacked run's checkpoint keeps its layout: one tensor per scan group, the layer axis at
    // param_scan_axis (each rank's chunk a box of it).
    const nlohmann::json index = nlohmann::json::parse(std::ifstream(fs::path(stacked_path) / "index.json"));
    const nlohmann::json& tensors = index.at("tensors");
    ASSERT_TRUE(tensors.contains("decoder/layers/mlp/wo/kernel"));  // [F, D] per layer
    const std::vector<std::vector<int64_t>> expected = {{3, 48, 32}, {48, 3, 32}, {48, 32, 3}};
    EXPECT_EQ(tensors.at("decoder/layers/mlp/wo/kernel").at("dims"),
              expected[static_cast<size_t>(std::min(std::stoi(axis), 2))])
        << axis;
    EXPECT_FALSE(tensors.contains("decoder/layers_0/mlp/wo/kernel"));
    const std::vector<int64_t> norm_shape =
        axis == "0" ? std::vector<int64_t>{3, 32} : std::vector<int64_t>{32, 3};
    EXPECT_EQ(tensors.at("adam_m/decoder/layers/pre_self_attention_layer_norm/scale").at("dims"), norm_shape);

    Engine back = engine_with({});
    fill_engine(back, 7.0f);
    load_checkpoint(stacked_path, back, false);
    EXPECT_TRUE(same_state(per_layer, back, true)) << "stacked at axis " << axis << " -> per layer";
    Engine other_axis = engine_with({"scan_layers=true", "param_scan_axis=2"});
    load_checkpoint(stacked_path, other_axis, false);
    expect_same_layers(per_layer, other_axis, "stacked at " + axis + " -> stacked at 2");
  }
  // A stacked checkpoint of another depth: the stacked tensor named with both shapes.
  Engine deeper = engine_with({"base_num_decoder_layers=4"});
  Engine stacked = engine_with({"scan_layers=true"});
  const std::string stacked_path = save_checkpoint((dir_ / "three").string(), stacked, state_at(3), {});
  const std::string message = error_of([&] { load_checkpoint(stacked_path, deeper, true); });
  EXPECT_TRUE(contains(message, "index.json: tensor 'decoder/layers/")) << message;
  EXPECT_TRUE(contains(message, "3, ")) << message;
  EXPECT_TRUE(contains(message, "4, ")) << message;
  EXPECT_TRUE(contains(message, "base_num_decoder_layers 3 in the checkpoint, 4 here")) << message;
}

// An unset scan_layers takes the checkpoint's; one the user set is kept (and the load converts).
TEST_F(CheckpointTest, AnUnsetScanLayersAdoptsTheCheckpoints) {
  std::vector<std::string> overrides = tiny_overrides();
  overrides.push_back("scan_layers=true");
  overrides.push_back("param_scan_axis=0");
  Engine stacked(load_config("qwen3-tiny", overrides));
  const std::string path = save_checkpoint(root(), stacked, state_at(4), {});
  Config unset = load_config("qwen3-tiny", tiny_overrides());
  unset.run_dir = (dir_ / "run").string();
  unset.load_full_state_path = path;
  const std::string line = adopt_checkpoint_layout(unset);
  EXPECT_TRUE(unset.scan_layers);
  EXPECT_EQ(unset.param_scan_axis, 0);
  EXPECT_TRUE(contains(line, "scan_layers=true param_scan_axis=0 (unset here) adopted from " + path)) << line;
  bool resolved = false;
  for (const auto& [key, value] : unset.resolved)
    resolved = resolved || (key == "scan_layers" && value == "true");
  EXPECT_TRUE(resolved);

  std::vector<std::string> given = tiny_overrides();
  given.push_back("scan_layers=false");
  Config set = load_config("qwen3-tiny", given);
  set.load_full_state_path = path;
  EXPECT_EQ(adopt_checkpoint_layout(set), "");
  EXPECT_FALSE(set.scan_layers);
  Engine per_layer(set);
  load_checkpoint(path, per_layer, false);
  expect_same_layers(per_layer, stacked, "stacked -> a run that set scan_layers=false");
}

TEST_F(CheckpointTest, ResavingTheSameStepReplacesIt) {
  Engine engine = make_engine();
  fill_engine(engine, 1.0f);
  save_checkpoint(root(), engine, state_at(4), {});
  fill_engine(engine, 2.0f);
  const std::string path = save_checkpoint(root(), engine, state_at(4), {});
  EXPECT_EQ(entries(), std::vector<std::string>{step_dir(4)});
  Engine loaded = make_engine();
  load_checkpoint(path, loaded, false);
  EXPECT_TRUE(same_state(engine, loaded, true));
}

// A child saves step 1, then step 2 with MESHTRAIN_CHECKPOINT_FAULT set, and must die by SIGKILL there.
TEST_F(CheckpointTest, KillAtEachPhaseNeverLeavesACompleteLookingPartialCheckpoint) {
  // Built before fork: the child only writes files (no OpenMP after fork).
  Engine engine = make_engine();
  for (const std::string phase :
       {"shard_half_written", "metadata_written", "before_commit", "after_commit"}) {
    SCOPED_TRACE(phase);
    fs::remove_all(root());
    fill_engine(engine, 1.0f);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      CheckpointOptions options;
      options.keep_last = 1;  // so after_commit dies with step 1 not yet pruned
      try {
        save_checkpoint(root(), engine, state_at(1), options);
        fill_engine(engine, 2.0f);
        ::setenv("MESHTRAIN_CHECKPOINT_FAULT", phase.c_str(), 1);
        save_checkpoint(root(), engine, state_at(2), options);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);  // the fault point was not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exit status "
                                     << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    EXPECT_EQ(WTERMSIG(status), SIGKILL);

    const bool committed = phase == "after_commit";
    const std::optional<std::string> latest = latest_checkpoint(root());
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(fs::path(*latest).filename().string(), step_dir(committed ? 2 : 1));
    EXPECT_TRUE(fs::is_regular_file(fs::path(*latest) / "COMMITTED"));
    const std::vector<std::string> names = entries();
    ASSERT_EQ(names.size(), 2u);  // step 1, and step 2 committed or the debris of the killed save
    if (!committed) {
      EXPECT_TRUE(contains(names[1], step_dir(2) + ".tmp-")) << names[1];
      const fs::path debris = fs::path(root()) / names[1];
      EXPECT_FALSE(fs::exists(debris / "COMMITTED"));
      EXPECT_TRUE(fs::exists(debris / "shards/rank_00000.safetensors"));
      EXPECT_EQ(fs::exists(debris / "index.json"), phase != "shard_half_written");
      EXPECT_EQ(fs::exists(debris / "COMMITTED.tmp"), phase == "before_commit");
    }
    Engine loaded = make_engine();
    EXPECT_EQ(load_checkpoint(*latest, loaded, false).step, committed ? 2 : 1);
    Engine expected = make_engine();
    fill_engine(expected, committed ? 2.0f : 1.0f);
    EXPECT_TRUE(same_state(expected, loaded, true));

    // The next save cleans up the debris (and, with keep_last=1, the older checkpoints).
    CheckpointOptions options;
    options.keep_last = 1;
    save_checkpoint(root(), engine, state_at(3), options);
    EXPECT_EQ(entries(), std::vector<std::string>{step_dir(3)});
  }
}

// RLIMIT_FSIZE with SIGXFSZ ignored makes writes fail with EFBIG, as a full disk fails them with ENOSPC.
TEST_F(CheckpointTest, FullDiskFailsClearlyAndKeepsThePreviousCheckpoint) {
  Engine engine = make_engine();
  fill_engine(engine, 1.0f);
  const uint64_t shard_bytes = [&] {
    save_checkpoint((dir_ / "probe").string(), engine, state_at(0), {});
    return fs::file_size(dir_ / "probe" / step_dir(0) / "shards/rank_00000.safetensors");
  }();
  // A limit that stops the shard half way, and one just under its whole size.
  for (const rlim_t limit : {static_cast<rlim_t>(shard_bytes / 2), static_cast<rlim_t>(shard_bytes - 4)}) {
    SCOPED_TRACE(limit);
    fs::remove_all(root());
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(pipe_fds[0]);
      int code = 0;
      std::string message;
      try {
        save_checkpoint(root(), engine, state_at(1), {});
        ::signal(SIGXFSZ, SIG_IGN);
        const rlimit small{limit, limit};
        if (::setrlimit(RLIMIT_FSIZE, &small) != 0) ::_exit(4);
        save_checkpoint(root(), engine, state_at(2), {});
        code = 5;  // the save should have failed
      } catch (const MeshError& error) {
        message = error.what();
      } catch (...) {
        code = 6;
      }
      if (::write(pipe_fds[1], message.data(), message.size()) < 0) code = 7;
      ::close(pipe_fds[1]);
      ::_exit(code);
    }
    ::close(pipe_fds[1]);
    std::string message;
    char buffer[4096];
    for (ssize_t got; (got = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) {
      message.append(buffer, static_cast<size_t>(got));
    }
    ::close(pipe_fds[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_TRUE(contains(message, "shards/rank_00000.safetensors")) << message;
    EXPECT_TRUE(contains(message, "File too large")) << message;
    EXPECT_TRUE(contains(message, "was not saved")) << message;
    EXPECT_EQ(entries(), std::vector<std::string>{step_dir(1)});
    const std::optional<std::string> latest = latest_checkpoint(root());
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(fs::path(*latest).filename().string(), step_dir(1));
    Engine loaded = make_engine();
    EXPECT_EQ(load_checkpoint(*latest, loaded, false).step, 1);
    EXPECT_TRUE(same_state(engine, loaded, true));
  }
}

TEST_F(CheckpointTest, CorruptionIsReportedWithTheFile) {
  Engine engine = make_engine();
  fill_engine(engine, 1.0f);
  const fs::path path = save_checkpoint(root(), engine, state_at(5), {});
  const fs::path shard = path / "shards/rank_00000.safetensors";
  const fs::path pristine = dir_ / "pristine.bin";
  fs::copy_file(shard, pristine);
  Engine target = make_engine();
  const std::string load_path = path.string();
  const auto load = [&] { load_checkpoint(load_path, target, false); };

  {  // one flipped byte in the tensor data: the chunk's CRC-32C names the tensor
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-100, std::ios::end);
    const char byte = static_cast<char>(file.get());
    file.seekp(-100, std::ios::end);
    file.put(static_cast<char>(byte ^ 0x10));
  }
  std::string message = error_of(load);
  EXPECT_TRUE(contains(message, "shards/rank_00000.safetensors")) << message;
  EXPECT_TRUE(contains(message, "CRC-32C")) << message;
  EXPECT_TRUE(contains(message, "for the chunk of tensor 'adam_v/")) << message;  // the last bytes

  fs::copy_file(pristine, shard, fs::copy_options::overwrite_existing);
  fs::resize_file(shard, fs::file_size(shard) - 10);
  message = error_of(load);
  EXPECT_TRUE(contains(message, "shards/rank_00000.safetensors")) << message;
  EXPECT_TRUE(contains(message, "truncated")) << message;

  fs::remove(shard);  // a missing chunk file
  message = error_of(load);
  EXPECT_TRUE(contains(message, "shards/rank_00000.safetensors: expected the shard file index.json lists"))
      << message;

  fs::copy_file(pristine, shard, fs::copy_options::overwrite_existing);
  EXPECT_EQ(error_of(load), "");  // restored: loads again

  {  // index.json is checksummed by metadata.json
    const std::string index = (path / "index.json").string();
    std::string text = read_file_text(index, "index");
    text[text.size() / 2] ^= 0x01;
    std::ofstream(index, std::ios::binary | std::ios::trunc) << text;
    message = error_of(load);
    EXPECT_TRUE(contains(message, "index.json")) << message;
    EXPECT_TRUE(contains(message, "CRC-32C")) << message;
  }

  fs::remove(path / "metadata.json");
  message = error_of(load);
  EXPECT_TRUE(contains(message, "metadata.json")) << message;

  fs::remove(path / "COMMITTED");
  message = error_of(load);
  EXPECT_TRUE(contains(message, "COMMITTED")) << message;
  EXPECT_EQ(latest_checkpoint(root()), std::nullopt);  // no marker: never taken for complete
}

TEST_F(CheckpointTest, MismatchedModelOrTokenizerIsRefused) {
  Engine engine = make_engine();
  CheckpointOptions options;
  options.tokenizer_identity = "tok-a";
  const std::string path = save_checkpoint(root(), engine, state_at(1), options);

  Engine narrower = make_engine("16");
  std::string message = error_of([&] { load_checkpoint(path, narrower, true); });
  EXPECT_TRUE(contains(message, "index.json: tensor '")) << message;
  EXPECT_TRUE(contains(message, "shape [")) << message;
  EXPECT_TRUE(contains(message, "base_emb_dim 32 in the checkpoint, 16 here")) << message;

  // 100 and 120 pad to the same 128 rows: only the vocab_size check can tell them apart.
  Engine other_vocab = make_engine("32", "120");
  message = error_of([&] { load_checkpoint(path, other_vocab, false); });
  EXPECT_TRUE(contains(message, "vocab_size")) << message;
  EXPECT_TRUE(contains(message, "120")) << message;

  Engine same = make_engine();
  message = error_of([&] { load_checkpoint(path, same, false, "tok-b"); });
  EXPECT_TRUE(contains(message, "tokenizer identity")) << message;
  EXPECT_TRUE(contains(message, "tok-a")) << message;
  EXPECT_EQ(error_of([&] { load_checkpoint(path, same, false, ""); }), "");  // unknown here: not checked
}

// The tokenizer a run starts from a checkpoint with (check_run_tokenizer): the checkpoint's loads silently;
// another one, or none (a synthetic run), is refused naming both sides, the checkpoint's copy and the key
// that allows it; allow_tokenizer_change turns the refusal into a warning naming both; a checkpoint that
// records none (an import without tokenizer.json) has nothing to compare and loads with a note.
TEST_F(CheckpointTest, ARunMustFeedTheCheckpointsTokenizer) {
  Engine engine = make_engine();
  const std::string copied = (dir_ / "tokenizer.json").string();
  std::ofstream(copied) << "{\"model\": {}}";
  CheckpointOptions options;
  options.tokenizer_path = copied;
  options.tokenizer_identity = "tok-a";
  const std::string path = save_checkpoint(root(), engine, state_at(1), options);
  const std::string copy = (fs::path(path) / "tokenizer.json").string();

  EXPECT_EQ(check_run_tokenizer(path, {"tok-a", "a/tokenizer.json"}), "");

  std::string message = error_of([&] { check_run_tokenizer(path, {"tok-b", "b/tokenizer.json"}); });
  for (const std::string& needle : {path + "/metadata.json: tokenizer", std::string("identity tok-a"), copy,
                                    std::string("tokenizer_path=b/tokenizer.json (identity tok-b)"),
                                    "tokenizer_path=" + copy, std::string("allow_tokenizer_change=true")}) {
    EXPECT_TRUE(contains(message, needle)) << needle << " not in: " << message;
  }
  message = error_of([&] { check_run_tokenizer(path, {"", "b/tokenizer.json"}); });
  EXPECT_TRUE(contains(message, "identity tok-a")) << message;
  EXPECT_TRUE(contains(message, "no tokenizer (dataset_type=synthetic")) << message;
  EXPECT_TRUE(contains(message, "allow_tokenizer_change=true")) << message;

  const std::string warning = check_run_tokenizer(path, {"tok-b", "b/tokenizer.json", true});
  EXPECT_TRUE(warning.starts_with("warning: allow_tokenizer_change=true")) << warning;
  EXPECT_TRUE(contains(warning, "identity tok-a")) << warning;
  EXPECT_TRUE(contains(warning, "identity tok-b")) << warning;
  EXPECT_TRUE(contains(warning, "b/tokenizer.json")) << warning;
  // The key allows a change, it does not hide a run of the same tokenizer.
  EXPECT_EQ(check_run_tokenizer(path, {"tok-a", "a/tokenizer.json", true}), "");

  // A checkpoint recording no tokenizer: nothing to compare, a note; neither side having one: silence.
  CheckpointOptions none;
  const std::string bare = save_checkpoint((dir_ / "bare").string(), engine, state_at(1), none);
  const std::string note = check_run_tokenizer(bare, {"tok-b", "b/tokenizer.json"});
  EXPECT_TRUE(note.starts_with("note: " + bare + " records no tokenizer")) << note;
  EXPECT_TRUE(contains(note, "tokenizer_path=b/tokenizer.json (identity tok-b)")) << note;
  EXPECT_EQ(check_run_tokenizer(bare, {"", ""}), "");

  // A checkpoint that is not one fails as its load would, naming what is missing.
  message = error_of([&] { check_run_tokenizer((dir_ / "none").string(), {"tok-a", ""}); });
  EXPECT_TRUE(contains(message, (dir_ / "none").string())) << message;
}

// Found by tests/fuzz/fuzz_checkpoint_metadata: a metadata.json whose marker matches it but whose layout keys
// are wrong (a string scan_layers, a negative param_scan_axis) escaped as a json exception or inserted the
// layer axis before a tensor's first dim (undefined behaviour), and a float where an integer belongs was
// converted with undefined behaviour. Each is now an error naming metadata.json, before the engine changes.
TEST_F(CheckpointTest, MetadataValuesOfTheWrongTypeOrRangeNameTheFile) {
  Engine saved = make_engine();
  fill_engine(saved, 0.5f);
  const fs::path path = save_checkpoint(root(), saved, state_at(3), {});
  const std::string pristine = read_file_text((path / "metadata.json").string(), "metadata");
  // metadata.json changed by `edit`, with a commit marker that matches it.
  const auto load_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json metadata = nlohmann::json::parse(pristine);
    edit(metadata);
    const std::string text = metadata.dump(2) + "\n";
    std::ofstream(path / "metadata.json", std::ios::binary | std::ios::trunc) << text;
    const nlohmann::json marker = {
        {"step", 3}, {"metadata_bytes", text.size()}, {"metadata_crc32c", crc32c(text.data(), text.size())}};
    std::ofstream(path / "COMMITTED", std::ios::trunc) << marker.dump() << "\n";
    Engine loaded = make_engine();
    return error_of([&] { load_checkpoint(path.string(), loaded, false); });
  };
  const std::string where = (path / "metadata.json").string() + ": expected ";
  std::string message = load_with([](nlohmann::json& m) { m["scan_layers"] = "yes"; });
  EXPECT_TRUE(contains(message, where + "scan_layers as true or false, found \"yes\"")) << message;
  message = load_with([](nlohmann::json& m) {
    m["scan_layers"] = true;
    m["param_scan_axis"] = -3;
  });
  EXPECT_TRUE(contains(message, where + "param_scan_axis as an integer from 0 to")) << message;
  message = load_with([](nlohmann::json& m) { m["step"] = 1e300; });
  EXPECT_TRUE(contains(message, where + "step as an integer from 0 to")) << message;
  message = load_with([](nlohmann::json& m) { m["format_version"] = 2.5; });
  EXPECT_TRUE(contains(message, where + "format_version as an integer")) << message;
  message = load_with([](nlohmann::json& m) { m["files"]["index.json"]["crc32c"] = -1; });
  EXPECT_TRUE(contains(message, "metadata.json: files: index.json: expected crc32c as an integer"))
      << message;
  EXPECT_EQ(load_with([](nlohmann::json&) {}), "");
}

// Engram: the checkpoint holds the compressed vocabulary, the multipliers and the table sizes. A load hashes
// with the checkpoint's multipliers (not the ones its own engram_seed draws); a compressed vocabulary or
// tables that differ are refused, naming engram.safetensors, before the engine changes.
TEST_F(CheckpointTest, EngramHashingTravelsWithTheCheckpoint) {
  const std::vector<std::string> engram = {"base_emb_dim=32",
                                           "base_num_query_heads=4",
                                           "base_num_kv_heads=4",
                                           "base_mlp_dim=48",
                                           "base_num_decoder_layers=2",
                                           "vocab_size=100",
                                           "max_target_length=8",
                                           "per_device_batch_size=2",
                                           "q_lora_rank=0",
                                           "kv_lora_rank=8",
                                           "qk_nope_head_dim=4",
                                           "qk_rope_head_dim=4",
                                           "v_head_dim=8",
                                           "num_experts=0",
                                           "engram_layers=[1]",
                                           "engram_num_heads=2",
                                           "engram_head_dim=4",
                                           "engram_vocab_bases=[31,37]",
                                           "mhc_expansion_rate=2"};
  const Config config = load_config("deepseek-tiny", engram);
  Engine engine(config);
  fill_engine(engine, 0.25f);
  EngramHashOptions options_a = engram_hash_options(config);
  const EngramHashing saved = make_engram_hashing(options_a, nullptr);
  CheckpointOptions options;
  options.engram_hashing = &saved;
  const std::string path = save_checkpoint(root(), engine, state_at(3), options);
  ASSERT_TRUE(fs::exists(fs::path(path) / "engram.safetensors"));

  // Another seed draws other multipliers: the load replaces them with the checkpoint's.
  options_a.seed = 7;
  EngramHashing run = make_engram_hashing(options_a, nullptr);
  ASSERT_NE(run.multipliers, saved.multipliers);
  Engine loaded(config);
  load_checkpoint(path, loaded, false, "", &run);
  EXPECT_EQ(run.multipliers, saved.multipliers);
  EXPECT_EQ(run.pad_id, saved.pad_id);

  // A tokenizer whose compressed map differs: refused, the engine untouched.
  EngramHashing other = make_engram_hashing(engram_hash_options(config), nullptr);
  other.compressed.compress[42] = 7;
  Engine untouched(config);
  const std::vector<char> before = buffer_bytes(untouched, untouched.spec().parameters.front().value);
  std::string message = error_of([&] { load_checkpoint(path, untouched, false, "", &other); });
  EXPECT_TRUE(contains(message, "engram.safetensors: tensor 'compress'")) << message;
  EXPECT_TRUE(contains(message, "token 42 -> 42")) << message;
  EXPECT_TRUE(contains(message, "use the tokenizer the checkpoint was trained with")) << message;
  EXPECT_EQ(buffer_bytes(untouched, untouched.spec().parameters.front().value), before);

  // Other tables (an edited size): refused naming the tensor and the config keys.
  EngramHashing tables = make_engram_hashing(engram_hash_options(config), nullptr);
  tables.table_sizes[0][1][0] = 53;  // was 41
  message = error_of([&] { load_checkpoint(path, untouched, false, "", &tables); });
  EXPECT_TRUE(contains(message, "layers_1/table_sizes")) << message;

  // A checkpoint of a model without Engram has no engram.safetensors.
  Engine dense = make_engine();
  const std::string dense_path = save_checkpoint((dir_ / "dense").string(), dense, state_at(1), {});
  message = error_of([&] { load_checkpoint(dense_path, untouched, true, "", &other); });
  EXPECT_TRUE(contains(message, "engram.safetensors")) << message;
}

// The checkpoint directory is itself a tokenizer path: GPT-2's two files travel together.
TEST_F(CheckpointTest, CopiesGpt2TokenizerFilesTogether) {
  Engine engine = make_engine();
  fs::create_directories(dir_ / "gpt2");
  std::ofstream(dir_ / "gpt2" / "encoder.json") << "{}";
  std::ofstream(dir_ / "gpt2" / "vocab.bpe") << "#version: 0.2\n";
  CheckpointOptions options;
  for (const fs::path& source : {dir_ / "gpt2" / "encoder.json", dir_ / "gpt2"}) {
    options.tokenizer_path = source.string();
    const fs::path path = save_checkpoint(root(), engine, state_at(1), options);
    EXPECT_TRUE(fs::is_regular_file(path / "encoder.json"));
    EXPECT_TRUE(fs::is_regular_file(path / "vocab.bpe"));
    EXPECT_FALSE(fs::exists(path / "tokenizer.json"));
  }
  options.tokenizer_path = (dir_ / "missing").string();
  const std::string message = error_of([&] { save_checkpoint(root(), engine, state_at(2), options); });
  EXPECT_TRUE(contains(message, "missing")) << message;
  EXPECT_EQ(entries(), std::vector<std::string>{step_dir(1)});
}

TEST_F(CheckpointTest, KeepLastDeletesTheOldest) {
  Engine engine = make_engine();
  CheckpointOptions options;
  options.keep_last = 2;
  for (int64_t step = 1; step <= 5; ++step) save_checkpoint(root(), engine, state_at(step * 10), options);
  EXPECT_EQ(entries(), (std::vector<std::string>{step_dir(40), step_dir(50)}));
  EXPECT_EQ(fs::path(*latest_checkpoint(root())).filename().string(), step_dir(50));
  EXPECT_EQ(latest_checkpoint((dir_ / "none").string()), std::nullopt);
}

}  // namespace
}  // namespace meshtrain
