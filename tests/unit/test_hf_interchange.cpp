// Hugging Face interchange against models made and run by transformers itself
// (tests/reference/hf_interchange/, with make_fixture.py): each folder imports into a checkpoint whose
// training forward gives transformers' logits and loss, whose decoder gives transformers' greedy tokens, and
// which exports back to the same tensors; special token ids, the model's name and recipe come through as the
// source has them; then the bad inputs: each names the file and tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "error_text.h"
#include "golden_files.h"
#include "gradcheck.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/infer/decoder.h"
#include "meshtrain/interchange/hf_interchange.h"
#include "meshtrain/io/safetensors_folder.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
const fs::path kFixture = fs::path(MESHTRAIN_SOURCE_DIR) / "tests/reference/hf_interchange";

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

class Scratch {
 public:
  Scratch() {
    path_ = fs::temp_directory_path() / ("meshtrain_hf_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::vector<std::string> fixture_variants() {
  std::ifstream file(kFixture / "golden_index.json");
  std::vector<std::string> variants;
  if (!file) return variants;
  const nlohmann::json index = nlohmann::json::parse(file);
  for (const nlohmann::json& variant : index.at("variants"))
    variants.push_back(variant.at("dir").get<std::string>());
  return variants;
}

std::vector<int64_t> read_ids(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.find(name);
  EXPECT_NE(entry, nullptr) << name;
  std::vector<int32_t> ids(static_cast<size_t>(entry->shape.empty() ? 1 : entry->shape[0]) *
                           static_cast<size_t>(entry->shape.size() > 1 ? entry->shape[1] : 1));
  file.read_i32(name, entry->shape, ids.data());
  return {ids.begin(), ids.end()};
}

// Logits [N, V_valid] of the last training kernel from its final hidden state.
std::vector<float> training_logits(const Engine& engine, int64_t N) {
  const ModelSpec& spec = engine.spec();
  const ModelDims& m = spec.dims;
  const bool tied = spec.config.logits_via_embedding;
  BufferId unembedding = spec.parameters.front().value;
  for (const ParameterDecl& parameter : spec.parameters) {
    const std::string& name = spec.buffer(parameter.value).name;
    if (tied ? name == "token_embedder/embedding" : name == "decoder/logits_dense/kernel")
      unembedding = parameter.value;
  }
  std::vector<float> logits(static_cast<size_t>(N * m.V));
  kernels::unembed_logits(logits.data(), engine.view(spec.final_hidden).f32(), engine.view(unembedding).f32(),
                          tied ? kernels::UnembedLayout::table_VD : kernels::UnembedLayout::kernel_DV, N, m.D,
                          m.V, m.V_valid);
  std::vector<float> valid;  // drop the padding columns (-inf)
  for (int64_t n = 0; n < N; ++n)
    valid.insert(valid.end(), logits.begin() + n * m.V, logits.begin() + n * m.V + m.V_valid);
  return valid;
}

void check_variant(const std::string& variant) {
  SCOPED_TRACE(variant);
  const fs::path folder = kFixture / variant;
  const SafetensorsFile golden = SafetensorsFile::open((folder / "golden.safetensors").string());
  Scratch scratch;
  std::ostringstream log;
  import_hugging_face({folder.string(), (scratch / "imported").string(), "", {}}, log);

  // The training forward: transformers' logits and loss on the golden sequence.
  const std::vector<int64_t> shape = golden.find("sequence")->shape;
  const int64_t B = shape[0], S = shape[1] - 1, N = B * S;
  const std::vector<int64_t> sequence = read_ids(golden, "sequence");
  Config config = checkpoint_config(
      (scratch / "imported").string(),
      {{"per_device_batch_size", std::to_string(B)}, {"max_target_length", std::to_string(S)}});
  Engine engine(config);
  load_checkpoint((scratch / "imported").string(), engine, /*parameters_only=*/true);
  Batch batch;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      batch.tokens.push_back(static_cast<int32_t>(sequence[static_cast<size_t>(b * (S + 1) + s)]));
      batch.targets.push_back(static_cast<int32_t>(sequence[static_cast<size_t>(b * (S + 1) + s + 1)]));
      batch.positions.push_back(static_cast<int32_t>(s));
    }
  }
  batch.segment_ids.assign(static_cast<size_t>(N), 0);
  batch.loss_mask.assign(static_cast<size_t>(N), 1);
  const LossSums sums = engine.eval(batch);
  const double loss = sums.loss_sum / static_cast<double>(sums.valid_count);
  const double expected_loss = testing::read_all(golden, "loss")[0];
  // float32 against float32 in another summation order.
  const double loss_error = std::fabs(loss - expected_loss) / expected_loss;
  testing::report_error(variant + " loss", loss_error, 1e-5);
  EXPECT_LT(loss_error, 1e-5);
  const double logits_error =
      testing::relative_error(training_logits(engine, N), testing::read_all(golden, "logits"));
  testing::report_error(variant + " logits", logits_error, 1e-5);
  EXPECT_LT(logits_error, 1e-5);

  // Greedy decoding through the decode plan: transformers' tokens, id for id.
  const std::vector<int64_t> prompt = read_ids(golden, "prompt_ids");
  const std::vector<int64_t> expected = read_ids(golden, "generated_ids");
  const Tokenizer tokenizer = Tokenizer::load((scratch / "imported").string());
  Config decode = checkpoint_config((scratch / "imported").string(),
                                    {{"per_device_batch_size", "1"}, {"max_target_length", "1"}});
  IncrementalDecoder decoder(decode, static_cast<int64_t>(prompt.size() + expected.size()), &tokenizer);
  load_checkpoint((scratch / "imported").string(), decoder.engine(), true, tokenizer.identity());
  std::vector<float> logits, fed_logits;  // after each fed token: transformers' generation_logits
  for (int64_t token : prompt) {
    logits = decoder.step(static_cast<int32_t>(token));
    fed_logits.insert(fed_logits.end(), logits.begin(), logits.end());
  }
  std::vector<int64_t> generated;
  for (size_t step = 0; step < expected.size(); ++step) {
    const int32_t token = sample_token(logits, {0.0, 0, 1.0}, 0, step);
    generated.push_back(token);
    if (step + 1 < expected.size()) {
      logits = decoder.step(token);
      fed_logits.insert(fed_logits.end(), logits.begin(), logits.end());
    }
  }
  EXPECT_EQ(generated, expected);
  const double decode_error =
      testing::relative_error(fed_logits, testing::read_all(golden, "generation_logits"));
  testing::report_error(variant + " decode logits", decode_error, 1e-5);
  EXPECT_LT(decode_error, 1e-5);

  // Export: the same tensors as the folder (float32 of whatever dtype it stored), and re-importing the
  // export gives the same checkpoint tensors bit for bit.
  export_hugging_face(
      {(scratch / "imported").string(), (scratch / "exported").string(), "float32", 5000000000}, log);
  const SafetensorsFolder original = SafetensorsFolder::open(folder.string());
  const SafetensorsFolder exported = SafetensorsFolder::open((scratch / "exported").string());
  for (const std::string& name : exported.tensor_names()) {
    std::string source = name;
    if (original.find(source).entry == nullptr && name.starts_with("transformer."))
      source = name.substr(std::string("transformer.").size());
    const auto from = original.find(source), to = exported.find(name);
    ASSERT_NE(from.entry, nullptr) << name;
    EXPECT_EQ(to.entry->dtype, "F32");
    ASSERT_EQ(from.entry->shape, to.entry->shape) << name;
    int64_t count = 1;
    for (int64_t size : to.entry->shape) count *= size;
    std::vector<float> a(static_cast<size_t>(count)), b(a.size());
    from.file->read_f32(source, from.entry->shape, a.data());
    to.file->read_f32(name, to.entry->shape, b.data());
    EXPECT_EQ(a, b) << name;
  }
  import_hugging_face({(scratch / "exported").string(), (scratch / "reimported").string(), "", {}}, log);
  const SafetensorsFile first = SafetensorsFile::open((scratch / "imported/model.safetensors").string());
  const SafetensorsFile second = SafetensorsFile::open((scratch / "reimported/model.safetensors").string());
  ASSERT_EQ(first.entries().size(), second.entries().size());
  for (const SafetensorsEntry& entry : first.entries()) {
    ASSERT_NE(second.find(entry.name), nullptr) << entry.name;
    EXPECT_EQ(testing::read_all(first, entry.name), testing::read_all(second, entry.name)) << entry.name;
  }
}

TEST(HfInterchange, EveryFixtureMatchesTransformers) {
  const std::vector<std::string> variants = fixture_variants();
  ASSERT_FALSE(variants.empty()) << "tests/reference/hf_interchange/golden_index.json lists no variant";
  for (const std::string& variant : variants) check_variant(variant);
}

// special_tokens/ (special_tokens.py): config.json's bos / eos / pad ids, null and absent ones too, come back
// in the export as they were, whatever the checkpoint's tokenizer says; the checkpoint names the model by its
// model_type and carries its recipe; a key=value of the import wins.
TEST(HfInterchange, SpecialTokenIdsNameAndRecipeAreTheModels) {
  std::ifstream file(kFixture / "special_tokens/expected.json");
  ASSERT_TRUE(file) << "tests/reference/hf_interchange/special_tokens/expected.json";
  const nlohmann::json expected = nlohmann::json::parse(file);
  Scratch scratch;
  std::ostringstream log;
  for (const auto& [variant, want] : expected.at("variants").items()) {
    SCOPED_TRACE(variant);
    const fs::path source = kFixture / "special_tokens" / variant;
    const HfImportSummary imported =
        import_hugging_face({source.string(), (scratch / variant).string(), "", {}}, log);
    const nlohmann::json model_type =
        nlohmann::json::parse(std::ifstream(source / "config.json"))["model_type"];
    EXPECT_EQ(imported.config.model_name, model_type.get<std::string>());
    EXPECT_EQ(imported.config.routed_bias_update_rate, model_type == "deepseek_v3" ? 0.001 : 0.0);
    EXPECT_EQ(imported.config.tokenizer_path,
              "");  // the folder has none, and the preset's is not the model's
    export_hugging_face(
        {(scratch / variant).string(), (scratch / (variant + ".hf")).string(), "float32", 5000000000}, log);
    const nlohmann::json exported =
        nlohmann::json::parse(std::ifstream(scratch / (variant + ".hf/config.json")));
    for (const auto& [key, value] : want.at("config_json").items()) {
      EXPECT_EQ(exported.contains(key) ? exported[key] : nlohmann::json("absent"), value) << key;
    }
  }
  const HfImportSummary overridden = import_hugging_face({(kFixture / "deepseek_v3").string(),
                                                          (scratch / "rate").string(),
                                                          "",
                                                          {"routed_bias_update_rate=0.002"}},
                                                         log);
  EXPECT_EQ(overridden.config.routed_bias_update_rate, 0.002);
}

// A copy of a fixture folder to damage.
fs::path copy_variant(const Scratch& scratch, const std::string& variant) {
  const fs::path copy = scratch / variant;
  fs::copy(kFixture / variant, copy, fs::copy_options::recursive);
  return copy;
}

void write_json(const fs::path& path, const nlohmann::json& value) {
  std::ofstream(path) << value.dump(2);
}

TEST(HfInterchange, BadFoldersNameTheFileAndTensorAndLeaveNothing) {
  const std::vector<std::string> variants = fixture_variants();
  ASSERT_FALSE(variants.empty());
  Scratch scratch;
  std::ostringstream log;
  const auto import_error = [&](const fs::path& folder) {
    const std::string out = (scratch / "out").string();
    const std::string message = testing::error_of([&] {
      import_hugging_face({folder.string(), out, "", {}}, log);
    });
    EXPECT_FALSE(fs::exists(out)) << "a failed import left " << out;
    for (const fs::directory_entry& entry : fs::directory_iterator(scratch / ""))
      EXPECT_FALSE(contains(entry.path().filename().string(), "out.tmp")) << entry.path();
    return message;
  };

  // An unsupported model_type.
  fs::path folder = copy_variant(scratch, "qwen3_tied");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(folder / "config.json"));
  config["model_type"] = "llama";
  write_json(folder / "config.json", config);
  std::string message = import_error(folder);
  EXPECT_TRUE(contains(message, "config.json") && contains(message, "llama")) << message;

  // A config that disagrees with the tensors: one layer fewer leaves layer 1's tensors extra; a wider
  // MLP mis-shapes every MLP tensor.
  config["model_type"] = "qwen3";
  config["num_hidden_layers"] = config["num_hidden_layers"].get<int64_t>() - 1;
  write_json(folder / "config.json", config);
  message = import_error(folder);
  EXPECT_TRUE(contains(message, "extra tensor") && contains(message, "model.layers.")) << message;
  config["num_hidden_layers"] = config["num_hidden_layers"].get<int64_t>() + 1;
  config["intermediate_size"] = config["intermediate_size"].get<int64_t>() + 8;
  write_json(folder / "config.json", config);
  message = import_error(folder);
  EXPECT_TRUE(contains(message, "mlp.") && contains(message, "shape")) << message;

  // A dtype the engine cannot convert (an int8 tensor, as a quantized checkpoint has), and a tied model
  // whose file holds an lm_head.weight that is not its embedding.
  fs::remove_all(folder);
  folder = copy_variant(scratch, "qwen3_tied");
  const auto rewrite = [&](const std::function<void(std::vector<SafetensorsTensor>&,
                                                    std::vector<std::vector<char>>&)>& change) {
    const fs::path path = folder / "model.safetensors";
    std::vector<SafetensorsTensor> tensors;
    std::vector<std::vector<char>> bytes;
    {
      const SafetensorsFile file = SafetensorsFile::open(path.string());
      for (const SafetensorsEntry& entry : file.entries()) {
        bytes.emplace_back(reinterpret_cast<const char*>(file.data(entry)),
                           reinterpret_cast<const char*>(file.data(entry)) + (entry.end - entry.begin));
        tensors.push_back({entry.name, entry.dtype, entry.shape, nullptr});
      }
    }
    change(tensors, bytes);
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = bytes[i].data();
    fs::remove(path);
    write_safetensors(path.string(), tensors, {{"format", "pt"}});
  };
  rewrite([](std::vector<SafetensorsTensor>& tensors, std::vector<std::vector<char>>& bytes) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].name != "model.norm.weight") continue;
      tensors[i].dtype = "I8";
      bytes[i].resize(bytes[i].size() / 4);
    }
  });
  message = import_error(folder);
  EXPECT_TRUE(contains(message, "model.norm.weight") && contains(message, "I8")) << message;
  fs::remove_all(folder);
  folder = copy_variant(scratch, "qwen3_tied");
  rewrite([](std::vector<SafetensorsTensor>& tensors, std::vector<std::vector<char>>& bytes) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].name != "model.embed_tokens.weight") continue;
      tensors.push_back({"lm_head.weight", tensors[i].dtype, tensors[i].shape, nullptr});
      std::vector<char> head = bytes[i];
      head[0] = static_cast<char>(head[0] ^ 0x10);  // one element differs from the embedding
      bytes.push_back(std::move(head));
      return;
    }
  });
  message = import_error(folder);
  EXPECT_TRUE(contains(message, "lm_head.weight") && contains(message, "tie_word_embeddings")) << message;

  // A model Hugging Face has no form for (mHC) is refused by its key before any tensor is read.
  message = testing::error_of([&] {
    import_hugging_face(
        {(kFixture / "deepseek_v3").string(), (scratch / "out").string(), "", {"mhc_expansion_rate=4"}}, log);
  });
  EXPECT_TRUE(contains(message, "mhc_expansion_rate")) << message;
  EXPECT_FALSE(fs::exists(scratch / "out"));

  // A sharded folder whose index names a shard that is not there, and a truncated shard.
  for (const std::string& variant : variants) {
    if (!fs::exists(kFixture / variant / "model.safetensors.index.json")) continue;
    folder = copy_variant(scratch, variant);
    const nlohmann::json index =
        nlohmann::json::parse(std::ifstream(folder / "model.safetensors.index.json"));
    const std::string shard = index.at("weight_map").begin().value().get<std::string>();
    fs::rename(folder / shard, scratch / "moved_shard");
    message = import_error(folder);
    EXPECT_TRUE(contains(message, shard)) << message;
    fs::rename(scratch / "moved_shard", folder / shard);
    fs::resize_file(folder / shard, fs::file_size(folder / shard) / 2);
    message = import_error(folder);
    EXPECT_TRUE(contains(message, shard)) << message;
    break;
  }
}

}  // namespace
}  // namespace meshtrain
