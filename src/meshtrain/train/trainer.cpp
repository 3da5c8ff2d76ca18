#include "meshtrain/train/trainer.h"

#include <omp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/corpus.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/machine.h"
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

// The ranks a run spans: the world, one communicator per mesh axis, and this rank's share of the batch.
struct RunRanks {
  std::unique_ptr<Communicator> world;
  MeshCommunicators axes;
  std::unique_ptr<Communicator>
      batch_group;        // the data x fsdp ranks that share this rank's tensor/context place
  int64_t data_rank = 0;  // which slice of every micro-batch: data x fsdp ranks see different rows
  int64_t data_ranks = 1;
  int64_t local_rows = 0;                           // rows of one micro-batch on this rank
  bool lead() const { return world->rank() == 0; }  // writes run_dir, prints, checkpoints
};

LoaderOptions loader_options(const Config& config, int32_t eos_id, bool shuffle, const RunRanks& ranks) {
  LoaderOptions options;
  options.sequence_length = config.max_target_length;
  options.per_device_batch_size = ranks.local_rows;
  options.data_ranks = ranks.data_ranks;
  options.gradient_accumulation_steps = shuffle ? config.gradient_accumulation_steps : 1;
  options.seed = static_cast<uint64_t>(config.data_shuffle_seed);
  options.packing = config.packing;
  options.shuffle = shuffle;
  options.eos_id = eos_id;
  options.vocab_size = config.vocab_size;
  return options;
}

std::optional<Tokenizer> load_run_tokenizer(const Config& config) {
  // Random ids from the seed need no vocabulary file: a synthetic run reads no file at all (the presets'
  // tokenizer_path and dataset_path are for the KJV main job).
  if (config.dataset_type == "synthetic") return std::nullopt;
  if (config.tokenizer_path.empty()) {
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

BatchLoader make_train_loader(const Config& config, const std::vector<std::string>& shards, int32_t eos_id,
                              const RunRanks& ranks) {
  if (config.dataset_type == "synthetic")
    return BatchLoader::synthetic(loader_options(config, eos_id, true, ranks));
  return BatchLoader::from_shards(shards, loader_options(config, eos_id, true, ranks));
}

std::optional<BatchLoader> make_eval_loader(const Config& config, int32_t eos_id, const RunRanks& ranks) {
  if (config.eval_interval <= 0 || config.eval_steps <= 0) return std::nullopt;
  if (config.dataset_type == "synthetic") {
    LoaderOptions options = loader_options(config, eos_id, false, ranks);
    options.seed += 0x5EED;  // held-out synthetic rows
    return BatchLoader::synthetic(options);
  }
  const std::string path = config.eval_dataset_path.empty() ? config.dataset_path : config.eval_dataset_path;
  return BatchLoader::from_shards(resolve_token_shards(path, "validation"),
                                  loader_options(config, eos_id, false, ranks));
}

// Loss sums of every rank's rows: data x fsdp ranks hold different rows (tensor ranks the same ones).
// (A communicator of its own, so the mesh axes' byte counters hold only what the plan's kernels move.)
LossSums sum_over_ranks(LossSums local, const RunRanks& ranks, const char* name) {
  if (ranks.batch_group->size() > 1) {
    ranks.batch_group->all_reduce(comm_buffer(&local.loss_sum, 1), ReduceOp::sum, name);
    ranks.batch_group->all_reduce(comm_buffer(&local.valid_count, 1), ReduceOp::sum, name);
  }
  return local;
}

// Mean loss over eval_steps batches of the held-out split, always from its beginning.
double evaluate(Engine& engine, BatchLoader& loader, int64_t eval_steps, const RunRanks& ranks) {
  loader.reset();
  LossSums total;
  for (int64_t i = 0; i < eval_steps; ++i) {
    const LossSums sums = engine.eval(loader.micro_batch(static_cast<int>(ranks.data_rank), 0));
    total.loss_sum += sums.loss_sum;
    total.valid_count += sums.valid_count;
    loader.advance();
  }
  total = sum_over_ranks(total, ranks, "eval/loss_sums");
  return total.valid_count > 0 ? total.loss_sum / static_cast<double>(total.valid_count) : 0.0;
}

// Test-only fault injection, MESHTRAIN_FAULT=KIND:STEP:RANK[:SECONDS] (KIND nan_loss, nan_gradient or
// stall): the failure tests of distributed runs make one rank misbehave at one step.
struct InjectedFault {
  std::string kind;
  int64_t step = -1, rank = -1;
  double seconds = 0.0;
  bool at(const char* what, int64_t now, int64_t this_rank) const {
    return kind == what && step == now && rank == this_rank;
  }
};

InjectedFault injected_fault() {
  InjectedFault fault;
  const char* text = std::getenv("MESHTRAIN_FAULT");
  if (!text) return fault;
  std::istringstream fields(text);
  std::string step, rank, seconds;
  std::getline(fields, fault.kind, ':');
  std::getline(fields, step, ':');
  std::getline(fields, rank, ':');
  std::getline(fields, seconds, ':');
  fault.step = step.empty() ? -1 : std::stoll(step);
  fault.rank = rank.empty() ? -1 : std::stoll(rank);
  fault.seconds = seconds.empty() ? 0.0 : std::stod(seconds);
  return fault;
}

// Every rank must run the same binary with the same config: a mismatch would hang or corrupt collectives.
uint64_t run_identity(const Config& config) {
  std::string text;
  for (const auto& [key, value] : config.resolved) text += key + "=" + value + "\n";
  std::ifstream binary("/proc/self/exe", std::ios::binary);
  const std::string executable((std::istreambuf_iterator<char>(binary)), std::istreambuf_iterator<char>());
  return (static_cast<uint64_t>(crc32c(text.data(), text.size())) << 32) |
         crc32c(executable.data(), executable.size());
}

void write_resolved_config(const Config& config, const std::string& run_dir) {
  std::string text = "# The resolved config of this run (base.yaml, preset, overrides).\n";
  for (const auto& [key, value] : config.resolved) text += key + ": \"" + value + "\"\n";
  write_file_atomically(run_dir + "/config.yaml", text);
}

// What set-up finds before any rank talks to another: every rank computes it alike, so its errors are
// printed by every rank (run_setup_on_all_ranks).
struct RunSetup {
  std::vector<std::string> train_shards;
  TrainingPlan plan;
  std::optional<Tokenizer> tokenizer;
};

RunSetup prepare_run(const Config& config, int64_t world_size) {
  if (config.steps <= 0)
    fail("config key 'steps'", "a positive number of optimizer steps", std::to_string(config.steps));
  RunSetup setup;
  setup.train_shards = train_shards(config);  // a missing dataset is the first thing to report
  PlanRequest request;
  request.config = config;
  request.devices = world_size;
  setup.plan = plan_training(request);
  check_plan_runs_here(setup.plan, world_size);  // the mesh's product must be the number of ranks
  // The kernels this run uses: a plan_in from meshtrain compile must match each of them exactly.
  if (!config.plan_in.empty()) {
    std::vector<KernelName> used_kernels = {KernelName::fwd_bwd, KernelName::update};
    if (config.gradient_accumulation_steps > 1) used_kernels.push_back(KernelName::fwd_bwd_accum);
    if (config.eval_interval > 0) used_kernels.push_back(KernelName::eval);
    for (KernelName kernel : used_kernels) verify_plan_file(setup.plan, kernel, config.plan_in);
  }
  setup.tokenizer = load_run_tokenizer(config);
  return setup;
}

TrainingSummary train_on_ranks(const Config& config, RunSetup setup, std::FILE* console,
                               const RunControl& control, RunRanks& ranks);

}  // namespace

TrainingSummary run_training(const Config& config, std::FILE* console, const RunControl& control) {
  // One process, or every rank of an mpirun job.
  RunRanks ranks;
  ranks.world = make_world_communicator(config.collective_timeout_s);
  RunSetup setup =
      run_setup_on_all_ranks(*ranks.world, [&] { return prepare_run(config, ranks.world->size()); });
  run_setup_on_all_ranks(*ranks.world, [&] {
    ranks.world->require_same_on_all_ranks(run_identity(config), "the meshtrain binary and resolved config");
  });
  try {
    return train_on_ranks(config, std::move(setup), console, control, ranks);
  } catch (const MeshError& error) {
    // An error one rank sees must end the others too, not leave them waiting in a collective.
    if (ranks.world->size() > 1) {
      std::fprintf(stderr, "meshtrain: error (rank %d): %s\n", ranks.world->rank(), error.what());
      std::fflush(stderr);
      ranks.world->abort_all_ranks(1);
    }
    throw;
  }
}

namespace {

TrainingSummary train_on_ranks(const Config& config, RunSetup setup, std::FILE* console,
                               const RunControl& control, RunRanks& ranks) {
  const std::vector<std::string>& shards = setup.train_shards;
  const Mesh mesh = setup.plan.mesh;
  ranks.axes = make_mesh_communicators(*ranks.world, mesh);
  Engine engine(std::move(setup.plan), {ranks.world.get(), &ranks.axes});
  const Topology& topology = engine.plan().topology;
  const MeshGroup batch_ranks = mesh_group(mesh, ranks.world->rank(), kBatchMeshAxes);
  ranks.batch_group =
      ranks.world->split(static_cast<int>(batch_ranks.colour), static_cast<int>(batch_ranks.index), "batch");
  ranks.data_rank = batch_ranks.index;
  ranks.data_ranks = batch_ranks.size;
  ranks.local_rows = engine.spec().dims.B;
  // Only the lead rank writes run_dir and prints; the others train silently.
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet(std::fopen("/dev/null", "w"), &std::fclose);
  if (!ranks.lead()) console = quiet.get();
  const bool lead = ranks.lead();
  const std::optional<Tokenizer>& tokenizer = setup.tokenizer;
  const int32_t eos_id = tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : -1;
  Config data_config = config;
  std::vector<std::string> train_shard_paths = shards;
  if (config.dataset_type == "text") {
    // The lead rank tokenizes; the others wait for its shards.
    data_config.dataset_path = data_config.eval_dataset_path =
        lead ? tokenize_text_dataset(config, *tokenizer, eos_id) : config.run_dir + "/data";
    ranks.world->barrier("text dataset tokenized");
    data_config.dataset_type = "tokens";
    train_shard_paths = resolve_token_shards(data_config.dataset_path, "train");
  }
  BatchLoader loader = make_train_loader(data_config, train_shard_paths, eos_id, ranks);
  std::optional<BatchLoader> eval_loader = make_eval_loader(data_config, eos_id, ranks);
  const std::string tokenizer_identity = tokenizer ? tokenizer->identity() : "";

  if (lead) fs::create_directories(config.run_dir);
  const std::string checkpoints_dir = config.run_dir + "/checkpoints";

  TrainingSummary summary;
  CheckpointState state;
  bool loaded_elsewhere =
      false;  // a full state from load_full_state_path (another run, perhaps another mesh)
  if (const std::optional<std::string> latest = latest_checkpoint(checkpoints_dir)) {
    state = load_checkpoint(*latest, engine, false, tokenizer_identity);
    std::fprintf(console, "resuming from %s (step %lld)\n", latest->c_str(),
                 static_cast<long long>(state.step));
  } else if (!config.load_full_state_path.empty()) {
    state = load_checkpoint(config.load_full_state_path, engine, false, tokenizer_identity);
    loaded_elsewhere = true;
  } else if (!config.load_parameters_path.empty()) {
    load_checkpoint(config.load_parameters_path, engine, true, tokenizer_identity);
  }
  if (!state.data_cursor.is_null()) loader.restore(state.data_cursor, "checkpoint data cursor");
  summary.first_step = state.step;
  // The CPU, the matmul backend and the measured GEMM peak that mfu is relative to (lead rank: it alone
  // writes metrics; measured after the engine set this rank's threads).
  std::optional<MachineReport> machine;
  if (lead) {
    machine = measure_machine();
    std::fprintf(console, "%s\n", machine->describe().c_str());
    write_resolved_config(config, config.run_dir);
    write_file_atomically(config.run_dir + "/machine.json", machine->to_json().dump(2) + "\n");
    // The plan this run executes, in the format of meshtrain compile's plan_out (byte for byte the same).
    for (KernelName kernel : kKernelNames) {
      write_file_atomically(plan_file_path(config.run_dir + "/plan", kernel),
                            serialize_kernel_plan(engine.plan(), kernel));
    }
    MetricsLog::truncate_after(config.run_dir + "/metrics.jsonl", state.step);
  }
  std::optional<MetricsLog> metrics;
  if (lead) metrics.emplace(config.run_dir, true);
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
    ranks.world->barrier("checkpoint saved");  // no rank resumes (or looks for it) before it is committed
  };

  const double tokens_per_step = static_cast<double>(loader.global_batch_rows() * config.max_target_length);
  const double step_flops = standard_training_flops(config).total();
  // mfu: against this machine's measured GEMM peak, not a stated one (the `cpu` topology's 230 GFLOP/s is a
  // Zen 4 at AVX2 width; a Zen 5 or a Xeon with two AVX-512 units reaches twice that).
  const double peak_flops = machine ? machine->gemm_peak_flops : topology.peak_flops(config.dtype);
  ProgressBar progress(config.steps, state.step, console);
  StopSignals signals;
  const InjectedFault fault = injected_fault();
  // A step runs fwd_bwd, GA - 1 x fwd_bwd_accum and update.
  nlohmann::json planned_step_bytes = nlohmann::json::object();
  for (const KernelPlan& kernel : engine.plan().kernels) {
    const double repeats = kernel.kernel == KernelName::fwd_bwd_accum
                               ? static_cast<double>(config.gradient_accumulation_steps - 1)
                           : kernel.kernel == KernelName::eval ? 0.0
                                                               : 1.0;
    for (const auto& [axis, bytes] : kernel.collective_bytes) {
      if (repeats > 0.0) planned_step_bytes[axis] = planned_step_bytes.value(axis, 0.0) + repeats * bytes;
    }
  }
  int64_t step = state.step;
  for (; step < config.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    trace.begin_step(step + 1);  // steps are numbered from 1, as in metrics.jsonl
    ranks.world->set_context("step " + std::to_string(step + 1));
    LossSums local;
    const int64_t rank = ranks.world->rank();
    engine.reset_collective_stats();
    if (fault.at("stall", step + 1, rank))
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
    for (int64_t micro = 0; micro < config.gradient_accumulation_steps; ++micro) {
      const Batch batch = loader.micro_batch(static_cast<int>(ranks.data_rank), static_cast<int>(micro));
      const bool last = micro + 1 == config.gradient_accumulation_steps;
      if (last && fault.at("nan_gradient", step + 1, rank)) engine.inject_nan_gradient();
      const LossSums micro_sums =
          micro == 0 ? engine.fwd_bwd(batch, last) : engine.fwd_bwd_accum(batch, last);
      local.loss_sum += micro_sums.loss_sum;
      local.valid_count += micro_sums.valid_count;
    }
    if (fault.at("nan_loss", step + 1, rank)) local.loss_sum = std::numeric_limits<double>::quiet_NaN();
    // Every rank sees a non-finite loss of any rank before the optimizer step, and which rank it was.
    const bool bad_here = !std::isfinite(local.loss_sum);
    int64_t lowest_bad =
        bad_here ? ranks.world->size() - ranks.world->rank() : 0;  // max picks the lowest rank
    ranks.world->all_reduce(comm_buffer(&lowest_bad, 1), ReduceOp::max, "step/nonfinite_rank");
    const int64_t first_bad_rank = ranks.world->size() - lowest_bad;
    const LossSums sums = sum_over_ranks(local, ranks, "step/loss_sums");
    const double loss = sums.valid_count > 0 ? sums.loss_sum / static_cast<double>(sums.valid_count) : 0.0;
    // Decided on the world-wide flag: a tensor peer of the bad rank sums only its own data x fsdp group.
    if (lowest_bad > 0 || !std::isfinite(loss)) {
      engine.abandon_step();  // the reductions started during the last backward finish before anything reuses
                              // them
      const std::string where = "training step " + std::to_string(step + 1) +
                                (ranks.world->size() > 1 ? ", rank " + std::to_string(first_bad_rank) : "");
      if (!config.skip_nonfinite_steps) {
        save(step);
        fail(where, "a finite loss", to_text(loss),
             "lower learning_rate, or set skip_nonfinite_steps=true to skip such steps");
      }
      progress.message(where + ": non-finite loss, step skipped");
      loader.advance();
      continue;
    }
    const double learning_rate = learning_rate_at(config, step);
    const UpdateResult update = engine.update(local.valid_count, learning_rate, step);
    if (update.nonfinite) {  // a non-finite gradient: the update left every parameter unchanged
      if (!config.skip_nonfinite_steps) {
        save(step);
        fail("training step " + std::to_string(step + 1), "finite gradients", "a non-finite gradient norm",
             "lower learning_rate, or set skip_nonfinite_steps=true to skip such steps");
      }
      progress.message("step " + std::to_string(step + 1) + ": non-finite gradient, step skipped");
      loader.advance();
      continue;
    }
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
    if (ranks.world->size() > 1) {
      // What the step's kernels moved per mesh axis (payload bytes per rank), next to what the plan says.
      nlohmann::json moved = nlohmann::json::object();
      for (const auto& [axis, bytes] : engine.collective_bytes()) moved[axis] = bytes;
      record["collective_bytes"] = moved;
      record["planned_collective_bytes"] = planned_step_bytes;
    }
    if (eval_loader && (step + 1) % config.eval_interval == 0) {
      summary.last_eval_loss = evaluate(engine, *eval_loader, config.eval_steps, ranks);
      record["eval"] = {{"loss", summary.last_eval_loss}, {"perplexity", std::exp(summary.last_eval_loss)}};
      progress.message("step " + std::to_string(step + 1) + ": eval loss " + to_text(summary.last_eval_loss));
    }
    if (metrics) metrics->write(record);
    if (trace.active() && lead)
      trace.write(config.run_dir + "/trace_step" + std::to_string(step + 1) + ".json");
    summary.last_loss = loss;
    progress.update(step + 1, loss, tokens_per_second);
    const bool last = step + 1 == config.steps;
    if (!last && config.checkpoint_period > 0 && (step + 1) % config.checkpoint_period == 0) save(step + 1);
    // A signal reaches the ranks at different moments: they stop together, at the same step.
    const bool stop = ranks.world->any_rank_true(stop_signal.load() != 0, "step/stop_signal");
    if (stop || step + 1 == control.stop_after_step) {
      ++step;
      summary.interrupted = true;
      break;
    }
  }
  progress.finish();
  summary.steps_completed = step;
  // With steps equal to a loaded state's step nothing trains and the state is saved into this run: that
  // converts a checkpoint to this run's mesh.
  if (step > state.step || summary.interrupted || loaded_elsewhere) save(step);
  if (summary.interrupted && stop_signal.load() != 0) {
    std::fprintf(console, "stopped by signal %d after step %lld; saved %s\n", stop_signal.load(),
                 static_cast<long long>(step), summary.last_checkpoint.c_str());
  }
  return summary;
}

}  // namespace
}  // namespace meshtrain
