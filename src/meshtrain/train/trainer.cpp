#include "meshtrain/train/trainer.h"

#include <omp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>

#include "meshtrain/core/error.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/progress.h"
#include "meshtrain/train/schedule.h"
#include "meshtrain/train/trace.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

std::atomic<int> stop_signal{0};
extern "C" void request_stop(int signal_number) {
  stop_signal.store(signal_number);
}

// Finishing the current step and saving beats dying mid-write: the handlers only raise a flag.
class StopSignals {
 public:
  StopSignals() {
    stop_signal.store(0);
    previous_interrupt_ = std::signal(SIGINT, request_stop);
    previous_terminate_ = std::signal(SIGTERM, request_stop);
  }
  ~StopSignals() {
    std::signal(SIGINT, previous_interrupt_);
    std::signal(SIGTERM, previous_terminate_);
  }

 private:
  void (*previous_interrupt_)(int);
  void (*previous_terminate_)(int);
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

LoaderOptions loader_options(const Config& config, int32_t eos_id, bool shuffle) {
  LoaderOptions options;
  options.sequence_length = config.max_target_length;
  options.per_device_batch_size = config.per_device_batch_size;
  options.data_ranks = 1;
  options.gradient_accumulation_steps = shuffle ? config.gradient_accumulation_steps : 1;
  options.seed = static_cast<uint64_t>(config.data_shuffle_seed);
  options.packing = config.packing;
  options.shuffle = shuffle;
  options.eos_id = eos_id;
  options.vocab_size = config.vocab_size;
  return options;
}

std::optional<Tokenizer> load_run_tokenizer(const Config& config) {
  if (config.tokenizer_path.empty()) {
    if (config.dataset_type == "synthetic") return std::nullopt;
    fail("config key 'tokenizer_path'", "the tokenizer the data was made with", "nothing",
         "run `meshtrain prepare` and pass tokenizer_path=data/kjv/tokenizer.json");
  }
  Tokenizer tokenizer = Tokenizer::load(config.tokenizer_path);
  if (tokenizer.vocab_size() != config.vocab_size) {
    fail("config key 'vocab_size'",
         "the tokenizer's vocabulary size " + std::to_string(tokenizer.vocab_size()) + " (" +
             tokenizer.source_path() + ")",
         std::to_string(config.vocab_size), "set vocab_size=" + std::to_string(tokenizer.vocab_size()));
  }
  return tokenizer;
}

// The train shards, resolved before anything else is loaded: a missing dataset is the first thing to report.
// dataset_type=text has none yet: its corpus is tokenized after the tokenizer is loaded.
std::vector<std::string> train_shards(const Config& config) {
  if (config.dataset_type == "synthetic" || config.dataset_type == "text") return {};
  if (config.dataset_type != "tokens") {
    fail("config key 'dataset_type'", "text, tokens or synthetic", "'" + config.dataset_type + "'",
         "did you mean '" + closest_name(config.dataset_type, {"text", "tokens", "synthetic"}) + "'?");
  }
  if (config.dataset_path.empty()) {
    fail("config key 'dataset_path'", "a .tokens shard or a folder from `meshtrain prepare`", "nothing",
         "run ./scripts/train.sh once, or `meshtrain prepare --out data/kjv`");
  }
  return resolve_token_shards(config.dataset_path, "train");
}

// dataset_type=text: the corpus (dataset_path's text files, or the King James Bible when empty) tokenized
// with the run's tokenizer into run_dir/data/{train,validation}.tokens, rebuilt at every start. For large
// corpora `meshtrain prepare` once and dataset_type=tokens is the better path.
std::string tokenize_text_dataset(const Config& config, const Tokenizer& tokenizer, int32_t eos_id) {
  if (eos_id < 0) {
    fail(tokenizer.source_path(), "a tokenizer with an end-of-text token (<|endoftext|>)", "none",
         "dataset_type=text packs documents with EOS between them");
  }
  const Corpus corpus = load_corpus(config.dataset_path, 0.05);
  const std::string dir = config.run_dir + "/data";
  fs::create_directories(dir);
  const auto encode_all = [&](const std::vector<Document>& documents) {
    std::vector<std::vector<int32_t>> ids(documents.size());
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < documents.size(); ++i) ids[i] = tokenizer.encode(documents[i].text);
    return ids;
  };
  write_token_shard(dir + "/train.tokens", encode_all(corpus.train), eos_id);
  write_token_shard(dir + "/validation.tokens", encode_all(corpus.validation), eos_id);
  return dir;
}

BatchLoader make_train_loader(const Config& config, const std::vector<std::string>& shards, int32_t eos_id) {
  if (config.dataset_type == "synthetic") return BatchLoader::synthetic(loader_options(config, eos_id, true));
  return BatchLoader::from_shards(shards, loader_options(config, eos_id, true));
}

std::optional<BatchLoader> make_eval_loader(const Config& config, int32_t eos_id) {
  if (config.eval_interval <= 0 || config.eval_steps <= 0) return std::nullopt;
  if (config.dataset_type == "synthetic") {
    LoaderOptions options = loader_options(config, eos_id, false);
    options.seed += 0x5EED;  // held-out synthetic rows
    return BatchLoader::synthetic(options);
  }
  const std::string path = config.eval_dataset_path.empty() ? config.dataset_path : config.eval_dataset_path;
  return BatchLoader::from_shards(resolve_token_shards(path, "validation"),
                                  loader_options(config, eos_id, false));
}

// Mean loss over eval_steps batches of the held-out split, always from its beginning.
double evaluate(Engine& engine, BatchLoader& loader, int64_t eval_steps) {
  loader.reset();
  LossSums total;
  for (int64_t i = 0; i < eval_steps; ++i) {
    const LossSums sums = engine.eval(loader.micro_batch(0, 0));
    total.loss_sum += sums.loss_sum;
    total.valid_count += sums.valid_count;
    loader.advance();
  }
  return total.valid_count > 0 ? total.loss_sum / static_cast<double>(total.valid_count) : 0.0;
}

void write_resolved_config(const Config& config, const std::string& run_dir) {
  std::string text = "# The resolved config of this run (base.yaml, preset, overrides).\n";
  for (const auto& [key, value] : config.resolved) text += key + ": \"" + value + "\"\n";
  write_file_atomically(run_dir + "/config.yaml", text);
}

}  // namespace

TrainingSummary run_training(const Config& config, std::FILE* console, const RunControl& control) {
  if (config.steps <= 0)
    fail("config key 'steps'", "a positive number of optimizer steps", std::to_string(config.steps));
  const std::vector<std::string> shards = train_shards(config);
  Engine engine(config);  // plans (threads, arena, op order) and refuses a plan that does not fit
  const Topology& topology = engine.plan().topology;
  // The kernels this run uses: a plan_in from meshtrain compile must match each of them exactly.
  std::vector<KernelName> used_kernels = {KernelName::fwd_bwd, KernelName::update};
  if (config.gradient_accumulation_steps > 1) used_kernels.push_back(KernelName::fwd_bwd_accum);
  if (config.eval_interval > 0) used_kernels.push_back(KernelName::eval);
  if (!config.plan_in.empty()) {
    for (KernelName kernel : used_kernels) verify_plan_file(engine.plan(), kernel, config.plan_in);
  }
  const std::optional<Tokenizer> tokenizer = load_run_tokenizer(config);
  const int32_t eos_id = tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : -1;
  Config data_config = config;
  std::vector<std::string> train_shard_paths = shards;
  if (config.dataset_type == "text") {
    data_config.dataset_path = data_config.eval_dataset_path =
        tokenize_text_dataset(config, *tokenizer, eos_id);
    data_config.dataset_type = "tokens";
    train_shard_paths = resolve_token_shards(data_config.dataset_path, "train");
  }
  BatchLoader loader = make_train_loader(data_config, train_shard_paths, eos_id);
  std::optional<BatchLoader> eval_loader = make_eval_loader(data_config, eos_id);
  const std::string tokenizer_identity = tokenizer ? tokenizer->identity() : "";

  fs::create_directories(config.run_dir);
  const std::string checkpoints_dir = config.run_dir + "/checkpoints";
  TrainingSummary summary;
  CheckpointState state;
  if (const std::optional<std::string> latest = latest_checkpoint(checkpoints_dir)) {
    state = load_checkpoint(*latest, engine, false, tokenizer_identity);
    std::fprintf(console, "resuming from %s (step %lld)\n", latest->c_str(),
                 static_cast<long long>(state.step));
  } else if (!config.load_full_state_path.empty()) {
    state = load_checkpoint(config.load_full_state_path, engine, false, tokenizer_identity);
  } else if (!config.load_parameters_path.empty()) {
    load_checkpoint(config.load_parameters_path, engine, true, tokenizer_identity);
  }
  if (!state.data_cursor.is_null()) loader.restore(state.data_cursor, "checkpoint data cursor");
  summary.first_step = state.step;
  write_resolved_config(config, config.run_dir);
  // The plan this run executes, in the format of meshtrain compile's plan_out (byte for byte the same).
  for (KernelName kernel : kKernelNames) {
    write_file_atomically(plan_file_path(config.run_dir + "/plan", kernel),
                          serialize_kernel_plan(engine.plan(), kernel));
  }
  MetricsLog::truncate_after(config.run_dir + "/metrics.jsonl", state.step);
  MetricsLog metrics(config.run_dir, true);
  TraceRecorder trace(config.profiler == "trace" ? config.profiler_steps : std::vector<int64_t>{});
  engine.set_trace(&trace);

  const CheckpointOptions checkpoint_options{tokenizer ? tokenizer->source_path() : "", tokenizer_identity,
                                             config.max_num_checkpoints_to_keep};
  const auto save = [&](int64_t step) {
    if (!config.enable_checkpointing) return;
    state.step = step;
    state.data_cursor = loader.cursor();
    state.rng = {{"init_weights_seed", config.init_weights_seed},
                 {"data_shuffle_seed", config.data_shuffle_seed}};
    summary.last_checkpoint = save_checkpoint(checkpoints_dir, engine, state, checkpoint_options);
  };

  const double tokens_per_step = static_cast<double>(loader.global_batch_rows() * config.max_target_length);
  const double step_flops = standard_training_flops(config).total();
  const double peak_flops = topology.peak_flops(config.dtype);
  ProgressBar progress(config.steps, state.step, console);
  StopSignals signals;
  int64_t step = state.step;
  for (; step < config.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    trace.begin_step(step + 1);  // steps are numbered from 1, as in metrics.jsonl
    LossSums sums;
    for (int64_t micro = 0; micro < config.gradient_accumulation_steps; ++micro) {
      const Batch batch = loader.micro_batch(0, static_cast<int>(micro));
      const LossSums micro_sums = micro == 0 ? engine.fwd_bwd(batch) : engine.fwd_bwd_accum(batch);
      sums.loss_sum += micro_sums.loss_sum;
      sums.valid_count += micro_sums.valid_count;
    }
    const double loss = sums.valid_count > 0 ? sums.loss_sum / static_cast<double>(sums.valid_count) : 0.0;
    if (!std::isfinite(loss)) {
      if (!config.skip_nonfinite_steps) {
        save(step);
        fail("training step " + std::to_string(step), "a finite loss", to_text(loss),
             "lower learning_rate, or set skip_nonfinite_steps=true to skip such steps");
      }
      progress.message("step " + std::to_string(step) + ": non-finite loss, step skipped");
      loader.advance();
      continue;
    }
    const double learning_rate = learning_rate_at(config, step);
    const UpdateResult update = engine.update(sums.valid_count, learning_rate, step);
    loader.advance();
    const double step_seconds = seconds_since(start);
    const double tokens_per_second = tokens_per_step / step_seconds;
    nlohmann::json record = {{"step", step + 1},
                             {"loss", loss},
                             {"lm_loss", loss},
                             {"perplexity", std::exp(loss)},
                             {"grad_norm", update.grad_norm},
                             {"raw_grad_norm", update.raw_grad_norm},
                             {"lr", learning_rate},
                             {"tokens_per_s", tokens_per_second},
                             {"tflops_per_device", step_flops / step_seconds / 1e12},
                             {"mfu", step_flops / step_seconds / peak_flops},
                             {"step_time_s", step_seconds},
                             {"peak_memory_bytes", peak_resident_bytes()},
                             {"valid_tokens", sums.valid_count}};
    if (eval_loader && (step + 1) % config.eval_interval == 0) {
      summary.last_eval_loss = evaluate(engine, *eval_loader, config.eval_steps);
      record["eval"] = {{"loss", summary.last_eval_loss}, {"perplexity", std::exp(summary.last_eval_loss)}};
      progress.message("step " + std::to_string(step + 1) + ": eval loss " + to_text(summary.last_eval_loss));
    }
    metrics.write(record);
    if (trace.active()) trace.write(config.run_dir + "/trace_step" + std::to_string(step + 1) + ".json");
    summary.last_loss = loss;
    progress.update(step + 1, loss, tokens_per_second);
    const bool last = step + 1 == config.steps;
    if (!last && config.checkpoint_period > 0 && (step + 1) % config.checkpoint_period == 0) save(step + 1);
    if (stop_signal.load() != 0 || step + 1 == control.stop_after_step) {
      ++step;
      summary.interrupted = true;
      break;
    }
  }
  progress.finish();
  summary.steps_completed = step;
  if (step > state.step || summary.interrupted) save(step);
  if (summary.interrupted && stop_signal.load() != 0) {
    std::fprintf(console, "stopped by signal %d after step %lld; saved %s\n", stop_signal.load(),
                 static_cast<long long>(step), summary.last_checkpoint.c_str());
  }
  return summary;
}

}  // namespace meshtrain
