// Generation: the incremental (KV-cache) decoder, stepping the planned decode program, against the engine's
// full forward pass on tiny Qwen3, GPT-2 and DeepSeek (MLA) models, the sampler's greedy, top-k, top-p and
// temperature behaviour, and `meshtrain generate` on a saved checkpoint. Legend: S sequence, D width, V vocab
// rows (padded), V_valid the vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "error_text.h"
#include "gradcheck.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/cli/generate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/infer/decoder.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"

namespace meshtrain {
namespace {

constexpr int64_t kLength = 12;

Config tiny_config(const std::string& preset, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"base_emb_dim=32",
                                        "base_num_query_heads=4",
                                        "head_dim=8",
                                        "base_mlp_dim=48",
                                        "base_num_decoder_layers=2",
                                        "vocab_size=100",
                                        "max_target_length=" + std::to_string(kLength),
                                        "per_device_batch_size=1",
                                        "init_weights_seed=5"};
  overrides.push_back(preset == "gpt2-124m" ? "base_num_kv_heads=4" : "base_num_kv_heads=2");
  if (preset == "gpt2-124m") overrides.push_back("max_position_embeddings=16");
  // An extra key replaces the default above (the command line takes each key once).
  for (std::string& item : extra) {
    const std::string key = item.substr(0, item.find('=') + 1);
    std::erase_if(overrides, [&](const std::string& existing) { return existing.starts_with(key); });
    overrides.push_back(std::move(item));
  }
  return load_config(preset, overrides);
}

// Larger weights than the 0.02 init make every path carry signal: with the default init the logits hardly
// depend on attention, and a wrong cache or position would hide under the rounding bound.
void scale_weights(Engine& engine) {
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    if (parameter.init != ParameterInit::normal) continue;
    const TensorView value = engine.view(parameter.value);
    for (int64_t i = 0; i < value.elements(); ++i) value.f32()[i] *= 10.0f;
  }
  // Norm scales and biases start at 1 and 0: perturb them too, so a swapped or skipped norm shows.
  std::mt19937 generator(17);
  std::uniform_real_distribution<float> jitter(-0.3f, 0.3f);
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    if (parameter.init == ParameterInit::normal) continue;
    const TensorView value = engine.view(parameter.value);
    for (int64_t i = 0; i < value.elements(); ++i) value.f32()[i] += jitter(generator);
  }
}

// A decoder over the decode plan of the engine's model, holding the engine's parameters.
IncrementalDecoder decoder_of(const Engine& engine, int64_t max_length) {
  IncrementalDecoder decoder(engine.spec().config, max_length);
  decoder.parameters().copy_from(engine.parameters());
  return decoder;
}

std::vector<int32_t> tokens_for(uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int32_t> token(0, 99);
  std::vector<int32_t> tokens(kLength);
  for (int32_t& t : tokens) t = token(generator);
  return tokens;
}

// Logits [S, V] of the engine's full forward pass over one row: positions 0..S-1, one segment.
std::vector<float> engine_logits(Engine& engine, const std::vector<int32_t>& tokens) {
  const ModelSpec& spec = engine.spec();
  const ModelDims& m = spec.dims;
  Batch batch;
  batch.tokens = tokens;
  batch.targets = tokens;
  for (int64_t s = 0; s < kLength; ++s) batch.positions.push_back(static_cast<int32_t>(s));
  batch.segment_ids.assign(kLength, 0);
  batch.loss_mask.assign(kLength, 1);
  if (!spec.config.engram_layers.empty()) {
    make_engram_hashing(engram_hash_options(spec.config), nullptr).add_to(batch, kLength);
  }
  engine.eval(batch);
  const bool tied = spec.config.logits_via_embedding;
  const std::string unembedding_name = tied ? "token_embedder/embedding" : "decoder/logits_dense/kernel";
  const float* unembedding = nullptr;
  for (const ParameterDecl& parameter : spec.parameters) {
    if (spec.buffer(parameter.value).name == unembedding_name)
      unembedding = engine.view(parameter.value).f32();
  }
  EXPECT_NE(unembedding, nullptr);
  std::vector<float> logits(static_cast<size_t>(kLength * m.V));
  kernels::unembed_logits(logits.data(), engine.view(spec.final_hidden).f32(), unembedding,
                          tied ? kernels::UnembedLayout::table_VD : kernels::UnembedLayout::kernel_DV,
                          kLength, m.D, m.V, m.V_valid);
  return logits;
}

std::vector<float> row(const std::vector<float>& logits, int64_t position, const ModelDims& m) {
  const auto begin = logits.begin() + position * m.V;
  return std::vector<float>(begin, begin + m.V_valid);
}

// Feeds the tokens one at a time and returns the largest per-position relative error against the engine.
double max_decoder_error(const Config& config, uint32_t token_seed) {
  Engine engine(config);
  scale_weights(engine);
  const ModelDims& m = engine.spec().dims;
  const std::vector<int32_t> tokens = tokens_for(token_seed);
  const std::vector<float> full = engine_logits(engine, tokens);

  IncrementalDecoder decoder = decoder_of(engine, kLength);
  double worst = 0.0, spread = 0.0;
  std::vector<std::vector<float>> first_pass;
  for (int64_t s = 0; s < kLength; ++s) {
    const std::vector<float> step = decoder.step(tokens[static_cast<size_t>(s)]);
    first_pass.push_back(step);
    EXPECT_EQ(static_cast<int64_t>(step.size()), m.V_valid);
    EXPECT_EQ(decoder.length(), s + 1);
    const std::vector<float> expected = row(full, s, m);
    worst = std::max(worst, testing::relative_error(step, expected));
    // Signal check: consecutive positions must differ by far more than the bound, or the comparison could
    // not see a decoder that ignores its cache.
    if (s > 0) spread = std::max(spread, testing::relative_error(expected, row(full, s - 1, m)));
  }
  EXPECT_GT(spread, 1e-1) << "logits barely change along the sequence: the test would have no signal";

  // reset() forgets the cache: feeding the same tokens again gives bitwise the logits of the first pass.
  decoder.reset();
  EXPECT_EQ(decoder.length(), 0);
  for (int64_t s = 0; s < kLength; ++s) {
    EXPECT_EQ(decoder.step(tokens[static_cast<size_t>(s)]), first_pass[static_cast<size_t>(s)]) << s;
  }
  return worst;
}

// Both sides are float32 with different summation orders (sgemm over 12 rows vs 1 row, tiled online softmax
// vs a plain one), so they agree to a few float32 ulps of the largest logit, not bitwise.
constexpr double kBound = 1e-5;

TEST(IncrementalDecoder, Qwen3MatchesFullForward) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const double error = max_decoder_error(tiny_config("qwen3-tiny"), seed);
    testing::report_error("qwen3 tied, tokens seed " + std::to_string(seed), error, kBound);
    EXPECT_LT(error, kBound);
  }
}

TEST(IncrementalDecoder, Qwen3UntiedMatchesFullForward) {
  const double error = max_decoder_error(tiny_config("qwen3-tiny", {"logits_via_embedding=false"}), 4);
  testing::report_error("qwen3 untied", error, kBound);
  EXPECT_LT(error, kBound);
}

TEST(IncrementalDecoder, Qwen3MultiQueryAndFullHeadsMatchFullForward) {
  // K = 1 (every query head shares one kv head) and K = H (no sharing) exercise the head mapping's ends.
  for (const char* kv : {"base_num_kv_heads=1", "base_num_kv_heads=4"}) {
    const double error = max_decoder_error(tiny_config("qwen3-tiny", {kv}), 5);
    testing::report_error(std::string("qwen3 ") + kv, error, kBound);
    EXPECT_LT(error, kBound);
  }
}

TEST(IncrementalDecoder, Gpt2MatchesFullForward) {
  for (uint32_t seed : {1u, 2u}) {
    const double error = max_decoder_error(tiny_config("gpt2-124m"), seed);
    testing::report_error("gpt2, tokens seed " + std::to_string(seed), error, kBound);
    EXPECT_LT(error, kBound);
  }
}

TEST(IncrementalDecoder, MlaMatchesFullForward) {
  // Multi-head latent attention: the decode step caches the expanded keys and the zero-padded values.
  for (const char* q_lora_rank : {"q_lora_rank=12", "q_lora_rank=0"}) {
    const double error = max_decoder_error(
        tiny_config("deepseek-tiny", {"base_num_kv_heads=4", q_lora_rank, "kv_lora_rank=10",
                                      "qk_nope_head_dim=6", "qk_rope_head_dim=4", "v_head_dim=8"}),
        6);
    testing::report_error(std::string("deepseek mla ") + q_lora_rank, error, kBound);
    EXPECT_LT(error, kBound);
  }
}

TEST(IncrementalDecoder, EngramAndMhcMatchFullForward) {
  // Engram on both layers: each step hashes its token with the N - 1 compressed ids before it, and the
  // ShortConv (4 taps, dilation 3) reads its last 9 inputs from the decode caches; mHC's 4 streams, and a
  // pointwise conv (K = 1: no history). Position 0's history is empty (the caches restart there).
  for (const char* streams_and_taps : {"mhc_expansion_rate=4", "mhc_expansion_rate=1"}) {
    for (const char* taps : {"engram_kernel_size=4", "engram_kernel_size=1"}) {
      const double error = max_decoder_error(
          tiny_config("deepseek-tiny",
                      {"base_num_kv_heads=4", "q_lora_rank=0", "kv_lora_rank=10", "qk_nope_head_dim=6",
                       "qk_rope_head_dim=4", "v_head_dim=8", "num_experts=0", "engram_layers=[0,1]",
                       "engram_num_heads=2", "engram_head_dim=4", "engram_vocab_bases=[31,37]",
                       streams_and_taps, taps}),
          6);
      testing::report_error(std::string("engram ") + streams_and_taps + " " + taps, error, kBound);
      EXPECT_LT(error, kBound);
    }
  }
}

TEST(IncrementalDecoder, ComparisonSeesAChangedToken) {
  // The metric's discrimination: one token changed at position 5 leaves positions 0..4 within the bound and
  // moves every later position far outside it (what a stale or misplaced cache entry would look like).
  Engine engine(tiny_config("qwen3-tiny"));
  scale_weights(engine);
  const ModelDims& m = engine.spec().dims;
  std::vector<int32_t> tokens = tokens_for(9);
  const std::vector<float> full = engine_logits(engine, tokens);
  tokens[5] = (tokens[5] + 1) % 100;
  IncrementalDecoder decoder = decoder_of(engine, kLength);
  for (int64_t s = 0; s < kLength; ++s) {
    const double error =
        testing::relative_error(decoder.step(tokens[static_cast<size_t>(s)]), row(full, s, m));
    if (s < 5) {
      EXPECT_LT(error, kBound) << "position " << s;
    } else {
      EXPECT_GT(error, 1e-3) << "position " << s;
    }
  }
}

TEST(IncrementalDecoder, RejectsOverflowAndBadTokens) {
  const Config qwen3 = tiny_config("qwen3-tiny");
  IncrementalDecoder decoder(qwen3, 2);
  EXPECT_THROW(decoder.step(100), MeshError);  // vocab_size = 100 (rows 100..127 are padding)
  EXPECT_THROW(decoder.step(-1), MeshError);
  decoder.step(1);
  decoder.step(2);
  EXPECT_THROW(decoder.step(3), MeshError);
  decoder.reset();
  EXPECT_EQ(decoder.length(), 0);
  EXPECT_NO_THROW(decoder.step(3));
  EXPECT_THROW(IncrementalDecoder(qwen3, 0), MeshError);

  const Config gpt2 = tiny_config("gpt2-124m");  // 16 learned positions
  EXPECT_THROW(IncrementalDecoder(gpt2, 17), MeshError);
  IncrementalDecoder full_table(gpt2, 16);
  for (int32_t t = 0; t < 16; ++t) full_table.step(t);
  try {
    full_table.step(0);
    ADD_FAILURE() << "a 17th position must be refused";
  } catch (const MeshError& error) {
    EXPECT_NE(error.context().hint.find("max_position_embeddings"), std::string::npos);
  }
}

// ---- Sampler ----

std::vector<float> random_logits(uint32_t seed, size_t count) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(count);
  for (float& value : logits) value = normal(generator);
  return logits;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(SampleToken, GreedyPicksArgmaxWithLowestIdOnTies) {
  std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(sample_token(logits, {0.0, 0, 1.0}, 0, 0), 1);
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f}));  // one-hot probabilities
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> random = random_logits(seed, 50);
    const int32_t expected = argmax(random);
    EXPECT_EQ(sample_token(random, {0.0, 0, 1.0}, seed, 3), expected);
  }
}

TEST(SampleToken, TopKOneAndTinyTopPEqualGreedy) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = random_logits(seed, 64);
    const int32_t greedy = argmax(logits);
    std::vector<float> scratch = logits;
    EXPECT_EQ(sample_token(scratch, {1.5, 1, 1.0}, seed, seed), greedy);
    scratch = logits;
    EXPECT_EQ(sample_token(scratch, {1.5, 0, 1e-9}, seed, seed), greedy);
  }
}

TEST(SampleToken, PaddingAndNaNAreNeverDrawn) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (uint64_t step = 0; step < 200; ++step) {
    std::vector<float> logits = {0.0f, -infinity, std::nanf(""), 0.0f, -infinity};
    const int32_t token = sample_token(logits, {5.0, 0, 1.0}, 1, step);
    EXPECT_TRUE(token == 0 || token == 3) << token;
  }
  std::vector<float> none = {-infinity, -infinity};
  EXPECT_THROW(sample_token(none, {1.0, 0, 1.0}, 0, 0), MeshError);
}

TEST(SampleToken, DeterministicForSeedAndStep) {
  const std::vector<float> logits = random_logits(3, 100);
  int differing = 0;
  for (uint64_t step = 0; step < 50; ++step) {
    std::vector<float> a = logits, b = logits, c = logits;
    const int32_t first = sample_token(a, {1.0, 20, 0.9}, 42, step);
    EXPECT_EQ(sample_token(b, {1.0, 20, 0.9}, 42, step), first);
    EXPECT_EQ(a, b);
    if (sample_token(c, {1.0, 20, 0.9}, 43, step) != first) ++differing;
  }
  EXPECT_GT(differing, 10);  // another seed is another stream
}

// Pearson's chi-square of `draws` samples against `expected` probabilities (cells with p > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected, int64_t draws) {
  double statistic = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double mean = expected[i] * static_cast<double>(draws);
    statistic += (static_cast<double>(counts[i]) - mean) * (static_cast<double>(counts[i]) - mean) / mean;
  }
  return statistic;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& value : p) value /= total;
  return p;
}

// 20000 draws over 5 tokens (4 degrees of freedom). Seeds are fixed, so the test is deterministic; the bound
// 18.47 is the chi-square critical value at p = 0.001, so a correct sampler passes it for almost any seed
// choice, while a wrong temperature (e.g. T = 1 instead of 0.7) gives a statistic in the hundreds.
TEST(SampleToken, TemperatureFollowsSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
  const double temperature = 0.7;
  const std::vector<double> expected = softmax(logits, temperature);
  const int64_t draws = 20000;
  // Across seeds at one step, and across steps of one seed: both are independent Philox counters.
  for (bool vary_seed : {true, false}) {
    std::vector<int64_t> counts(logits.size(), 0);
    for (int64_t i = 0; i < draws; ++i) {
      std::vector<float> scratch = logits;
      const uint64_t index = static_cast<uint64_t>(i);
      ++counts[static_cast<size_t>(
          sample_token(scratch, {temperature, 0, 1.0}, vary_seed ? index : 7, vary_seed ? 0 : index))];
      if (i == 0) {
        for (size_t t = 0; t < logits.size(); ++t) EXPECT_NEAR(scratch[t], expected[t], 1e-6);
      }
    }
    const double statistic = chi_square(counts, expected, draws);
    testing::report_error(vary_seed ? "chi-square over seeds" : "chi-square over steps", statistic, 18.47);
    EXPECT_LT(statistic, 18.47);
    // The same counts against T = 1 must be rejected: the test can tell temperatures apart.
    EXPECT_GT(chi_square(counts, softmax(logits, 1.0), draws), 100.0);
  }
}

// Top-k keeps the k largest and renormalises; top-p keeps the shortest prefix reaching p.
TEST(SampleToken, TopKAndTopPRenormalise) {
  // Probabilities 0.05, 0.5, 0.15, 0.3 at T = 1.
  const std::vector<float> logits = {std::log(0.05f), std::log(0.5f), std::log(0.15f), std::log(0.3f)};
  std::vector<float> scratch = logits;
  sample_token(scratch, {1.0, 2, 1.0}, 0, 0);
  const std::vector<double> top2 = {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8};
  for (size_t t = 0; t < 4; ++t) EXPECT_NEAR(scratch[t], top2[t], 1e-6) << t;
  scratch = logits;
  sample_token(scratch, {1.0, 0, 0.75}, 0, 0);  // 0.5 < 0.75 <= 0.5 + 0.3
  for (size_t t = 0; t < 4; ++t) EXPECT_NEAR(scratch[t], top2[t], 1e-6) << t;
  scratch = logits;
  sample_token(scratch, {1.0, 0, 0.85}, 0, 0);  // needs the third token too
  const std::vector<double> top3 = {0.0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95};
  for (size_t t = 0; t < 4; ++t) EXPECT_NEAR(scratch[t], top3[t], 1e-6) << t;
  scratch = logits;
  sample_token(scratch, {1.0, 3, 0.7}, 0, 0);  // top-k first (0.5, 0.3, 0.15), then 0.7 of that renormalised
  EXPECT_NEAR(scratch[0], 0.0, 1e-7);
  EXPECT_NEAR(scratch[1], 0.5 / 0.8, 1e-6);  // 0.5/0.95 = 0.526 < 0.7 <= 0.842: two tokens
  EXPECT_NEAR(scratch[2], 0.0, 1e-7);

  const int64_t draws = 20000;
  std::vector<int64_t> counts(4, 0);
  for (int64_t i = 0; i < draws; ++i) {
    scratch = logits;
    ++counts[static_cast<size_t>(sample_token(scratch, {1.0, 2, 1.0}, 5, static_cast<uint64_t>(i)))];
  }
  const double statistic = chi_square(counts, top2, draws);  // 1 degree of freedom: 10.83 at p = 0.001
  testing::report_error("chi-square top-k=2", statistic, 10.83);
  EXPECT_LT(statistic, 10.83);
}

TEST(SampleToken, RejectsOptionsOutOfRange) {
  std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_THROW(sample_token(logits, {-0.1, 0, 1.0}, 0, 0), MeshError);
  EXPECT_THROW(sample_token(logits, {1.0, -1, 1.0}, 0, 0), MeshError);
  EXPECT_THROW(sample_token(logits, {1.0, 0, 0.0}, 0, 0), MeshError);
  EXPECT_THROW(sample_token(logits, {1.0, 0, 1.5}, 0, 0), MeshError);
}

// ---- meshtrain generate ----

namespace fs = std::filesystem;

// A run directory with one committed checkpoint of a tiny Qwen3 (weights x10, so the text depends on the
// seed) and a BPE tokenizer trained on a few lines, removed afterwards.
class GenerateRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::temp_directory_path() / ("meshtrain_generate_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::vector<std::string_view> texts = {"the cat sat on the mat", "a dog ate the bone",
                                                 "the quick brown fox jumps over the lazy dog"};
    const Tokenizer trained = train_bpe_tokenizer(texts, 300, {"<|endoftext|>"});
    save_trained_tokenizer(trained, (dir_ / "tokenizer.json").string());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load((dir_ / "tokenizer.json").string()));
    engine_ = std::make_unique<Engine>(
        tiny_config("qwen3-tiny", {"vocab_size=" + std::to_string(tokenizer_->vocab_size())}));
    scale_weights(*engine_);
    CheckpointOptions options;
    options.tokenizer_path = (dir_ / "tokenizer.json").string();
    options.tokenizer_identity = tokenizer_->identity();
    checkpoint_ =
        save_checkpoint((dir_ / "run" / "checkpoints").string(), *engine_, CheckpointState{}, options);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string generate(std::vector<std::string> arguments) {
    std::ostringstream out;
    run_generate(arguments, out);
    return out.str();
  }

  // Greedy continuation computed here with the decoder on the test's own engine.
  std::string greedy(const std::string& prompt, int64_t new_tokens) {
    const std::vector<int32_t> ids = tokenizer_->encode(prompt);
    IncrementalDecoder decoder = decoder_of(*engine_, static_cast<int64_t>(ids.size()) + new_tokens);
    std::vector<float> logits;
    for (int32_t id : ids) logits = decoder.step(id);
    std::vector<int32_t> generated;
    for (int64_t i = 0; i < new_tokens; ++i) {
      const int32_t token = sample_token(logits, {0.0, 0, 1.0}, 0, 0);
      if (token == tokenizer_->eos_id()) break;
      generated.push_back(token);
      logits = decoder.step(token);
    }
    return prompt + tokenizer_->decode(generated) + "\n";
  }

  fs::path dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::string checkpoint_;
};

TEST_F(GenerateRun, GreedyMatchesTheDecoderFromRunDirCheckpointsDirOrStep) {
  const std::string expected = greedy("the cat", 8);
  EXPECT_GT(expected.size(), std::string("the cat\n").size());
  for (const std::string& where :
       {(dir_ / "run").string(), (dir_ / "run" / "checkpoints").string(), checkpoint_}) {
    EXPECT_EQ(generate({"--checkpoint", where, "--prompt", "the cat", "--max-new-tokens", "8",
                        "--temperature", "0"}),
              expected)
        << where;
  }
  // --flag=value spelling, and top-k = 1 at any temperature is greedy too.
  EXPECT_EQ(generate({"--checkpoint=" + checkpoint_, "--prompt=the cat", "--max-new-tokens=8", "--top-k=1",
                      "--temperature=2"}),
            expected);
}

// --output ids: the same greedy continuation as ids, for comparing with other implementations by id.
TEST_F(GenerateRun, OutputIdsGivesTheGreedyTokens) {
  const std::string line = generate({"--checkpoint", checkpoint_, "--prompt", "the cat", "--max-new-tokens",
                                     "6", "--temperature", "0", "--output", "ids"});
  const nlohmann::json ids = nlohmann::json::parse(line);
  EXPECT_EQ(ids["prompt"].get<std::vector<int32_t>>(), tokenizer_->encode("the cat"));
  EXPECT_EQ("the cat" + tokenizer_->decode(ids["generated"].get<std::vector<int32_t>>()) + "\n",
            greedy("the cat", 6));
  EXPECT_THROW(generate({"--checkpoint", checkpoint_, "--prompt", "x", "--output", "tokens"}), MeshError);
}

// --prompt-ids is the counterpart of --output ids: the ids of a text prompt give the same line as the text,
// comma-separated or from a JSON file; the default output with ids is ids.
TEST_F(GenerateRun, PromptIdsGiveTheSameLineAsTheirText) {
  const std::vector<std::string> greedy_flags = {"--max-new-tokens", "6", "--temperature", "0"};
  const auto line = [&](std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), {"--checkpoint", checkpoint_});
    arguments.insert(arguments.end(), greedy_flags.begin(), greedy_flags.end());
    return generate(arguments);
  };
  const std::string from_text = line({"--prompt", "the cat", "--output", "ids"});
  const std::vector<int32_t> prompt = nlohmann::json::parse(from_text)["prompt"].get<std::vector<int32_t>>();
  ASSERT_GT(prompt.size(), 1u);
  std::string listed;
  for (int32_t id : prompt) listed += (listed.empty() ? "" : ",") + std::to_string(id);
  EXPECT_EQ(line({"--prompt-ids", listed, "--output", "ids"}), from_text);
  EXPECT_EQ(line({"--prompt-ids=" + listed}), from_text);
  std::ofstream((dir_ / "prompt.json").string()) << nlohmann::json(prompt).dump() << "\n";
  EXPECT_EQ(line({"--prompt-ids", "@" + (dir_ / "prompt.json").string()}), from_text);
  // Text output from ids, with the tokenizer: the decoded prompt and the same continuation as from the text.
  EXPECT_EQ(line({"--prompt-ids", listed, "--output", "text"}), greedy("the cat", 6));
}

// A checkpoint without a tokenizer copy (a run on synthetic data, an import without tokenizer.json)
// generates from ids: the same tokens as the same parameters with the tokenizer, which only adds the stop at
// EOS.
TEST_F(GenerateRun, WithoutTokenizerFilesIdsStillGenerate) {
  const auto generated = [&](const std::string& checkpoint) {
    const std::string line = generate({"--checkpoint", checkpoint, "--prompt-ids", "5,17,3",
                                       "--max-new-tokens", "10", "--temperature", "0"});
    return nlohmann::json::parse(line)["generated"].get<std::vector<int32_t>>();
  };
  const std::vector<int32_t> with_tokenizer = generated(checkpoint_);
  const std::string bare = save_checkpoint((dir_ / "bare" / "checkpoints").string(), *engine_,
                                           CheckpointState{}, CheckpointOptions{});
  for (const char* name : {"tokenizer.json", "encoder.json", "vocab.bpe"}) {
    ASSERT_FALSE(fs::exists(fs::path(bare) / name)) << name;
  }
  const std::vector<int32_t> without = generated(bare);
  ASSERT_EQ(without.size(), 10u);
  EXPECT_EQ(std::vector<int32_t>(without.begin(), without.begin() + static_cast<long>(with_tokenizer.size())),
            with_tokenizer);
  if (with_tokenizer.size() < without.size()) {
    EXPECT_EQ(without[with_tokenizer.size()], tokenizer_->eos_id());
  }

  const std::string prompt_error = testing::error_of([&] {
    generate({"--checkpoint", bare, "--prompt", "the cat"});
  });
  EXPECT_NE(prompt_error.find("tokenizer copy"), std::string::npos) << prompt_error;
  EXPECT_NE(prompt_error.find("--prompt-ids"), std::string::npos) << prompt_error;
  const std::string text_error = testing::error_of([&] {
    generate({"--checkpoint", bare, "--prompt-ids", "5", "--output", "text"});
  });
  EXPECT_NE(text_error.find("--output text"), std::string::npos) << text_error;
  EXPECT_NE(text_error.find("--output ids"), std::string::npos) << text_error;
}

TEST_F(GenerateRun, BadPromptIdsNameTheIdAndItsPosition) {
  const auto error_of = [&](std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), {"--checkpoint", checkpoint_});
    return testing::error_of([&] { generate(arguments); });
  };
  const std::string vocab = std::to_string(tokenizer_->vocab_size());
  const std::string too_large = error_of({"--prompt-ids", "1," + vocab});
  EXPECT_NE(too_large.find("id " + vocab + " at position 1"), std::string::npos) << too_large;
  EXPECT_NE(too_large.find("vocab_size is " + vocab), std::string::npos) << too_large;
  EXPECT_NE(error_of({"--prompt-ids", "1,-2"}).find("'-2' at position 1"), std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", "1,,2"}).find("'' at position 1"), std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", "1 2"}).find("'1 2' at position 0"), std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", "99999999999"}).find("'99999999999'"), std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", ""}).find("at position 0"), std::string::npos);
  std::ofstream((dir_ / "empty.json").string()) << "[]";
  EXPECT_NE(error_of({"--prompt-ids", "@" + (dir_ / "empty.json").string()}).find("at least one token id"),
            std::string::npos);
  std::ofstream((dir_ / "text.json").string()) << "[1, \"a\"]";
  EXPECT_NE(error_of({"--prompt-ids", "@" + (dir_ / "text.json").string()}).find("at position 1"),
            std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", "@" + (dir_ / "missing.json").string()}).find("missing.json"),
            std::string::npos);
  EXPECT_NE(error_of({"--prompt-ids", "1", "--prompt", "x"}).find("found both"), std::string::npos);
  EXPECT_NE(error_of({"--max-new-tokens", "3"}).find("found neither"), std::string::npos);
}

TEST_F(GenerateRun, SeedReproducesAndChangesTheText) {
  const auto sampled = [&](const std::string& seed) {
    return generate({"--checkpoint", checkpoint_, "--prompt", "the", "--max-new-tokens", "12",
                     "--temperature", "1", "--seed", seed});
  };
  const std::string first = sampled("1");
  EXPECT_TRUE(first.starts_with("the"));
  EXPECT_EQ(sampled("1"), first);
  int differing = 0;
  for (const char* seed : {"2", "3", "4", "5"}) differing += sampled(seed) != first ? 1 : 0;
  EXPECT_GT(differing, 0);
  EXPECT_EQ(generate({"--checkpoint", checkpoint_, "--prompt", "the", "--max-new-tokens", "0"}), "the\n");
}

TEST_F(GenerateRun, BadInputIsAMeshErrorWithAHint) {
  const auto error_of = [&](std::vector<std::string> arguments) -> ErrorContext {
    try {
      generate(std::move(arguments));
    } catch (const MeshError& error) {
      return error.context();
    }
    ADD_FAILURE() << "expected a MeshError";
    return {};
  };
  EXPECT_NE(error_of({"--prompt", "x"}).where.find("--checkpoint"), std::string::npos);
  EXPECT_NE(error_of({"--checkpoint", checkpoint_}).where.find("--prompt"), std::string::npos);
  EXPECT_FALSE(error_of({"--checkpoint", checkpoint_, "--prompt", ""}).hint.empty());
  EXPECT_NE(error_of({"--checkpoint", checkpoint_, "--prompt", "x", "--top-pp", "0.5"}).hint.find("--top-p"),
            std::string::npos);
  EXPECT_FALSE(error_of({"--checkpoint", checkpoint_, "--prompt", "x", "--top-p", "0"}).expected.empty());
  EXPECT_FALSE(
      error_of({"--checkpoint", checkpoint_, "--prompt", "x", "--max-new-tokens", "-1"}).expected.empty());
  EXPECT_FALSE(
      error_of({"--checkpoint", checkpoint_, "--prompt", "x", "--temperature", "hot"}).expected.empty());
  EXPECT_FALSE(
      error_of({"--checkpoint", checkpoint_, "--prompt", "x", "--seed", "1", "--seed", "2"}).hint.empty());
  fs::create_directories(dir_ / "empty");
  EXPECT_FALSE(error_of({"--checkpoint", (dir_ / "empty").string(), "--prompt", "x"}).hint.empty());
  EXPECT_FALSE(error_of({"--checkpoint", (dir_ / "missing").string(), "--prompt", "x"}).found.empty());
}

}  // namespace
}  // namespace meshtrain
