// The Run object: set-up phases and one optimizer step (see run.h).
#include "meshtrain/train/run.h"

#include <link.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/stop_signals.h"
#include "meshtrain/data/sources.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

}  // namespace

namespace {

// The train split accumulates gradient_accumulation_steps micro-batches and is shuffled unless
// enable_data_shuffling=false; eval reads one micro-batch per step in stream order.
LoaderOptions loader_options(const Config& config, int32_t eos_id, Split split, const RunRanks& ranks) {
  const bool train = split == Split::train;
  LoaderOptions options;
  options.sequence_length = config.max_target_length;
  options.per_device_batch_size = ranks.local_rows;
  options.data_ranks = ranks.data_ranks;
  options.gradient_accumulation_steps = train ? config.gradient_accumulation_steps : 1;
  options.seed = static_cast<uint64_t>(config.data_shuffle_seed);
  options.packing = config.packing;
  options.shuffle = train && config.enable_data_shuffling;
  options.eos_id = eos_id;
  options.vocab_size = config.vocab_size;
  options.allow_data_change = config.allow_data_change;
  return options;
}

Tokenizer load_run_tokenizer(const Config& config) {
  if (config.tokenizer_path.empty()) {
    fail("config key 'tokenizer_path'", "the tokenizer the data was made with", "nothing",
         "run `meshtrain prepare` and pass tokenizer_path=data/kjv/tokenizer.json");
  }
  Tokenizer tokenizer = Tokenizer::load(config.tokenizer_path);
  // A model may have more rows than its tokenizer has ids (Hugging Face's Qwen3: 151,936 rows for 151,669
  // ids): the extra rows are never fed, and their logits train like any other. Engram compresses the
  // tokenizer's vocabulary, which must then be the model's.
  const bool fewer_ids_allowed = config.engram_layers.empty() && tokenizer.vocab_size() < config.vocab_size;
  if (tokenizer.vocab_size() != config.vocab_size && !fewer_ids_allowed) {
    fail("config key 'vocab_size'",
         std::string(config.engram_layers.empty() ? "at least" : "exactly (Engram compresses it)") +
             " the tokenizer's vocabulary size " + std::to_string(tokenizer.vocab_size()) + " (" +
             tokenizer.source_path() + ")",
         std::to_string(config.vocab_size), "set vocab_size=" + std::to_string(tokenizer.vocab_size()));
  }
  return tokenizer;
}

// The data source of each dataset_type: the one place the data keys become a source (one path or a mixture,
// data/sources.h). The rest of the run sees only the DataSource interface.
std::unique_ptr<DataSource> text_files_source(const Config& config) {
  if (config.train_data_columns.empty()) {
    fail("config key 'train_data_columns'", "the name of the column holding a record's text", "nothing",
         "leave it at its default, train_data_columns=text");
  }
  RecordOptions records;
  records.column = config.train_data_columns;
  // Tokenized with the run's tokenizer into run_dir/data, rebuilt at every start.
  return make_text_files_source(config.dataset_path, config.run_dir + "/data", records);
}

std::unique_ptr<DataSource> token_shards_source(const Config& config) {
  return make_token_shards_source(config.dataset_path, config.eval_dataset_path);
}

std::unique_ptr<DataSource> synthetic_source(const Config& /*config*/) {
  return std::make_unique<SyntheticSource>();
}

struct DatasetSourceEntry {
  DatasetType type;
  std::unique_ptr<DataSource> (*open)(const Config& config);
};
constexpr std::array<DatasetSourceEntry, kDatasetTypes.size()> kDatasetSources = {{
    {DatasetType::text, text_files_source},
    {DatasetType::tokens, token_shards_source},
    {DatasetType::synthetic, synthetic_source},
}};
static_assert(
    [] {
      for (size_t i = 0; i < kDatasetSources.size(); ++i)
        if (kDatasetSources[i].type != kDatasetTypes[i]) return false;
      return true;
    }(),
    "kDatasetSources follows kDatasetTypes' order");

// Made before anything else is loaded: a missing dataset is the first thing to report.
std::unique_ptr<DataSource> open_data_source(const Config& config) {
  return kDatasetSources[static_cast<size_t>(config.dataset_type)].open(config);
}

// Where each of a stage's MoE layers is among the whole model's (Engine::whole_model: the same list without
// stages).
std::vector<size_t> moe_layers_in_model(const Engine& engine) {
  const std::vector<std::string>& all = engine.whole_model().moe_layers;
  std::vector<size_t> places;
  for (const std::string& name : engine.spec().moe_layers)
    places.push_back(static_cast<size_t>(std::find(all.begin(), all.end(), name) - all.begin()));
  return places;
}

// Pipeline stages: the step's sums of the whole model from a stage's own. The loss and z-loss sums are the
// last stage's (the valid count every stage's alike: each counts the micro-batches' tokens); each stage's MoE
// statistics go to its layers' places among the model's MoE layers, so the balance loss and the metrics cover
// every layer.
LossSums whole_model_sums(const LossSums& local, const Engine& engine, Communicator& stage_group,
                          const char* name) {
  const ModelSpec& whole = engine.whole_model();
  const size_t layers = whole.moe_layers.size();
  const auto E = static_cast<size_t>(whole.moe_experts);
  // One buffer: the loss and z-loss sums, then per model MoE layer its expert loads, its drops and its
  // balance loss.
  constexpr size_t kLosses = 2;
  std::vector<double> packed(kLosses + layers * (E + 2), 0.0);
  packed[0] = local.loss_sum;
  packed[1] = local.z_loss_sum;
  const std::vector<size_t> places = moe_layers_in_model(engine);
  const bool with_routing = local.routing.dropped.size() == places.size();  // eval's sums hold none
  for (size_t k = 0; with_routing && k < places.size(); ++k) {
    double* layer = packed.data() + kLosses + places[k] * (E + 2);
    std::copy_n(local.routing.expert_load.begin() + static_cast<std::ptrdiff_t>(k * E), E, layer);
    layer[E] = local.routing.dropped[k];
    layer[E + 1] = local.routing.balance_loss[k];
  }
  stage_group.all_reduce(comm_buffer(packed), ReduceOp::sum, name);
  LossSums sums;
  sums.loss_sum = packed[0];
  sums.z_loss_sum = packed[1];
  sums.valid_count = local.valid_count;
  for (size_t layer = 0; layer < layers; ++layer) {
    const double* values = packed.data() + kLosses + layer * (E + 2);
    sums.routing.expert_load.insert(sums.routing.expert_load.end(), values, values + E);
    sums.routing.dropped.push_back(values[E]);
    sums.routing.balance_loss.push_back(values[E + 1]);
  }
  return sums;
}

// Loss sums of every rank's tokens, of the whole model: the stage ranks' first (whole_model_sums), then
// data x fsdp x expert ranks hold different rows, context ranks different tokens of them (tensor ranks the
// same ones). (Communicators of their own, so the mesh axes' byte counters hold only what the plan's
// kernels move.)
LossSums sum_over_ranks(const LossSums& own, const Engine& engine, const RunRanks& ranks, const char* name) {
  LossSums local = ranks.stage_group ? whole_model_sums(own, engine, *ranks.stage_group, name) : own;
  Communicator& group = ranks.loss_group ? *ranks.loss_group : *ranks.batch_group;
  if (group.size() > 1) {
    double losses[] = {local.loss_sum, local.z_loss_sum};  // in one call
    group.all_reduce(comm_buffer(losses, 2), ReduceOp::sum, name);
    local.loss_sum = losses[0];
    local.z_loss_sum = losses[1];
    group.all_reduce(comm_buffer(&local.valid_count, 1), ReduceOp::sum, name);
    RoutingSums& routing = local.routing;
    if (!routing.dropped.empty()) {  // MoE layers: their statistics in one call
      std::vector<double> packed = routing.expert_load;
      packed.insert(packed.end(), routing.dropped.begin(), routing.dropped.end());
      packed.insert(packed.end(), routing.balance_loss.begin(), routing.balance_loss.end());
      group.all_reduce(comm_buffer(packed), ReduceOp::sum, name);
      const auto loads = static_cast<std::ptrdiff_t>(routing.expert_load.size());
      const auto layers = static_cast<std::ptrdiff_t>(routing.dropped.size());
      std::copy(packed.begin(), packed.begin() + loads, routing.expert_load.begin());
      std::copy(packed.begin() + loads, packed.begin() + loads + layers, routing.dropped.begin());
      std::copy(packed.begin() + loads + layers, packed.end(), routing.balance_loss.begin());
    }
  }
  return local;
}

// The expert loads of a stage's own MoE layers from the model's (a stage moves its own layers' biases).
std::vector<double> own_expert_loads(const std::vector<double>& model_loads, const Engine& engine) {
  const auto E = static_cast<size_t>(engine.whole_model().moe_experts);
  std::vector<double> loads;
  for (size_t place : moe_layers_in_model(engine)) {
    const auto begin = model_loads.begin() + static_cast<std::ptrdiff_t>(place * E);
    loads.insert(loads.end(), begin, begin + static_cast<std::ptrdiff_t>(E));
  }
  return loads;
}

// Per MoE layer: the expert load (the busiest expert's assignments over the mean), the fraction of
// assignments dropped by capacity and the balance loss (its share of the step's objective).
nlohmann::json routing_metrics(const ModelSpec& spec, const LossSums& sums) {
  nlohmann::json layers = nlohmann::json::object();
  const auto E = static_cast<size_t>(spec.moe_experts);
  const double valid = static_cast<double>(std::max<int64_t>(sums.valid_count, 1));
  for (size_t layer = 0; layer < spec.moe_layers.size(); ++layer) {
    const auto begin = sums.routing.expert_load.begin() + static_cast<std::ptrdiff_t>(layer * E);
    const double total = std::accumulate(begin, begin + static_cast<std::ptrdiff_t>(E), 0.0);
    const double busiest = *std::max_element(begin, begin + static_cast<std::ptrdiff_t>(E));
    layers[spec.moe_layers[layer]] = {
        {"load_max_over_mean", total > 0.0 ? busiest / (total / static_cast<double>(E)) : 0.0},
        {"dropped_fraction", total > 0.0 ? sums.routing.dropped[layer] / total : 0.0},
        {"balance_loss", sums.routing.balance_loss[layer] / valid}};
  }
  return layers;
}

// This rank's part of each micro-batch of the loader's current step.
MicroBatchSource micro_batches(BatchLoader& loader, const RunRanks& ranks) {
  return [&loader, &ranks](int64_t micro) {
    return ranks.tokens_here(loader.micro_batch(static_cast<int>(ranks.data_rank), static_cast<int>(micro)));
  };
}

// Mean loss over eval_steps batches of the held-out split, always from its beginning.
double evaluate(Engine& engine, BatchLoader& loader, int64_t eval_steps, const RunRanks& ranks) {
  loader.reset();
  LossSums total;
  for (int64_t i = 0; i < eval_steps; ++i) {
    const LossSums sums = engine.run_program(engine.plan().program.eval, {micro_batches(loader, ranks)}).sums;
    total.loss_sum += sums.loss_sum;
    total.valid_count += sums.valid_count;
    loader.advance();
  }
  total = sum_over_ranks(total, engine, ranks, "eval/loss_sums");
  return total.valid_count > 0 ? total.loss_sum / static_cast<double>(total.valid_count) : 0.0;
}

// Hex text: an identity to compare (which tokens a step read), not a number for TensorBoard to plot.
std::string batch_checksum_text(uint32_t crc32c) {
  char checksum[9];
  std::snprintf(checksum, sizeof checksum, "%08x", crc32c);
  return checksum;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f s", seconds);
  return text;
}

// MESHTRAIN_FAULT=sigusr1|sigterm:STEP:RANK: the rank sends itself the signal during step STEP, after its
// batches are taken (STEP 0: during set-up, before the first step), as a scheduler's signal would arrive.
void raise_injected_signal(const InjectedFault& fault, int64_t step, int64_t rank) {
  if (fault.at("sigusr1", step, rank)) std::raise(SIGUSR1);
  if (fault.at("sigterm", step, rank)) std::raise(SIGTERM);
}

InjectedFault injected_fault() {
  InjectedFault fault;
  const char* text = std::getenv("MESHTRAIN_FAULT");
  if (!text) return fault;
  std::istringstream fields(text);
  std::string step, rank, value;
  std::getline(fields, fault.kind, ':');
  std::getline(fields, step, ':');
  std::getline(fields, rank, ':');
  std::getline(fields, value, ':');
  fault.step = step.empty() ? -1 : std::stoll(step);
  fault.rank = rank.empty() ? -1 : std::stoll(rank);
  fault.value = value.empty() ? 0.0 : std::stod(value);
  return fault;
}

// MESHTRAIN_FAULT=spike_loss:STEP:RANK[:COUNT]: whether this rank's loss sum is multiplied (by 1000) in step
// `step`, one of COUNT steps from STEP (default 1). Rank RANK's and those of the ranks that differ from it
// only along stage and tensor: they hold the same rows (the last stage computes their loss sums, the others
// add 0; tensor peers compute the same sums), so a real spike would show on all of them alike.
bool spike_injected(const InjectedFault& fault, const Mesh& mesh, int64_t step, int64_t rank) {
  const int64_t count = std::max<int64_t>(1, static_cast<int64_t>(fault.value));
  if (fault.kind != "spike_loss" || step < fault.step || step >= fault.step + count) return false;
  if (fault.rank < 0 || fault.rank >= mesh.devices()) return false;
  constexpr std::array<MeshAxis, 2> same_rows = {MeshAxis::stage, MeshAxis::tensor};
  return mesh_group(mesh, rank, same_rows).colour == mesh_group(mesh, fault.rank, same_rows).colour;
}

void write_resolved_config(const Config& config, const std::string& run_dir) {
  std::string text = "# The resolved config of this run (base.yaml, preset, overrides).\n";
  for (const auto& [key, value] : config.resolved) text += key + ": \"" + value + "\"\n";
  write_file_atomically(run_dir + "/config.yaml", text);
}

}  // namespace

std::vector<std::string> process_code_files() {
  std::vector<std::string> libraries;
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* found) {
        const std::string path = object->dlpi_name != nullptr ? object->dlpi_name : "";
        if (fs::path(path).filename().string().starts_with("libmeshtrain_"))
          static_cast<std::vector<std::string>*>(found)->push_back(path);
        return 0;
      },
      &libraries);
  std::sort(libraries.begin(), libraries.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).filename() < fs::path(b).filename();
  });
  libraries.insert(libraries.begin(), "/proc/self/exe");
  return libraries;
}

// The files are read in blocks, not whole: the sanitizer build's unit-test executable is 140 MB.
uint64_t run_identity(const Config& config) {
  std::string text;
  for (const auto& [key, value] : config.resolved) text += key + "=" + value + "\n";
  uint32_t code = 0;
  for (const std::string& path : process_code_files()) {
    const FileChecksum file =
        checksum_file(path, "this process's code, readable (it is checked alike on every rank)");
    code = crc32c(&file.crc32c, sizeof file.crc32c, crc32c(&file.bytes, sizeof file.bytes, code));
  }
  return (static_cast<uint64_t>(crc32c(text.data(), text.size())) << 32) | code;
}

std::string keep_checkpoint_global_batch(Config& config, int64_t world_size) {
  // A full state only: load_parameters_path starts a new data order.
  const std::string start =
      latest_checkpoint(config.run_dir + "/checkpoints").value_or(config.load_full_state_path);
  if (start.empty() || config.per_device_batch_size < 1) return "";  // a bad batch size: the plan reports it
  const std::string where = start + "/metadata.json: data_cursor";
  const std::optional<int64_t> global_rows = cursor_global_batch_rows(saved_data_cursor(start), where);
  if (!global_rows) return "";
  // Every device holds per_device_batch_size rows of a micro-batch (context and tensor ranks share theirs).
  const int64_t micro_rows = config.per_device_batch_size * world_size;
  const std::string processes = std::to_string(world_size) + " process" + (world_size > 1 ? "es" : "");
  if (*global_rows % micro_rows != 0) {
    const Mesh mesh = resolve_mesh(config.mesh, world_size, processes);
    int64_t data_ranks = 1;
    for (MeshAxis axis : kBatchMeshAxes) data_ranks *= mesh.size(axis);
    fail(where,
         "per_device_batch_size x devices dividing the checkpoint's global batch of " +
             std::to_string(*global_rows) + " rows (gradient_accumulation_steps is derived from it)",
         "per_device_batch_size " + std::to_string(config.per_device_batch_size) + " x " + processes + " = " +
             std::to_string(micro_rows) + " rows a micro-batch (mesh " + mesh.to_string() + ": " +
             std::to_string(data_ranks) + " data ranks of " + std::to_string(micro_rows / data_ranks) +
             " rows)",
         "resume on a process count and per_device_batch_size whose product divides " +
             std::to_string(*global_rows) + ", or use a fresh run_dir to train with another global batch");
  }
  const int64_t accumulation = *global_rows / micro_rows;
  if (accumulation == config.gradient_accumulation_steps) return "";
  const int64_t configured = config.gradient_accumulation_steps;
  config.set("gradient_accumulation_steps", std::to_string(accumulation));
  return "gradient_accumulation_steps " + std::to_string(configured) + " -> " + std::to_string(accumulation) +
         ", derived to keep the global batch of " + std::to_string(*global_rows) + " rows of " + start +
         " (" + std::to_string(accumulation) + " x per_device_batch_size " +
         std::to_string(config.per_device_batch_size) + " x " + processes + ")";
}

RunSetup prepare_run(const Config& config, int64_t world_size, int64_t rank,
                     const ProcessPlacement* placement) {
  if (config.steps <= 0)
    fail("config key 'steps'", "a positive number of optimizer steps", std::to_string(config.steps));
  RunSetup setup;
  setup.data = open_data_source(config);  // a missing dataset is the first thing to report
  PlanRequest request;
  request.config = config;
  request.devices = world_size;
  if (placement != nullptr) {
    request.threads = placement->threads;
    request.devices_launcher = placement->launcher;
  }
  // A pipeline stage rank plans its own chunk and schedule.
  request.stage = mesh_coordinates(resolve_plan_target(request).mesh, rank)[MeshAxis::stage];
  setup.plan = plan_training(request);
  // The mesh's product must be the number of ranks; GPUs are not shared unless asked (share_gpus).
  check_plan_runs_here(setup.plan, world_size, placement != nullptr ? placement->local_ranks : 0);
  // The kernels this run uses: a plan_in from meshtrain compile must match each of them exactly.
  if (!config.plan_in.empty()) {
    const StepProgram& program = setup.plan.program;
    std::vector<KernelName> used_kernels = program_kernels(program.gradients);
    for (KernelName kernel : program_kernels(program.update)) used_kernels.push_back(kernel);
    if (config.eval_interval > 0) {
      for (KernelName kernel : program_kernels(program.eval)) used_kernels.push_back(kernel);
    }
    // Each chunk's, on a stage rank with several (plan_file_path).
    for (const KernelPlan& kernel : setup.plan.kernels) {
      if (std::find(used_kernels.begin(), used_kernels.end(), kernel.kernel) != used_kernels.end())
        verify_plan_file(setup.plan, kernel.kernel, config.plan_in, kernel.chunk);
    }
  }
  // Synthetic ids need no vocabulary file: such a run reads no file at all (the presets' tokenizer_path and
  // dataset_path are for the KJV main job).
  if (setup.data->needs_tokenizer()) setup.tokenizer = load_run_tokenizer(config);
  // The checkpoint the run starts from must have been trained with this tokenizer: checked before any data
  // is prepared.
  if (const std::string start = run_start_checkpoint(config); !start.empty()) {
    const RunTokenizer run_tokenizer{setup.tokenizer ? setup.tokenizer->identity() : "",
                                     config.tokenizer_path, config.allow_tokenizer_change};
    setup.tokenizer_note = check_run_tokenizer(start, run_tokenizer);
  }
  return setup;
}

Run::Run(const Config& config, RunSetup setup, std::FILE* console, RunRanks& ranks)
    : config_(config),
      ranks_(ranks),
      mesh_(setup.plan.mesh),
      quiet_(nullptr, &std::fclose),
      console_(console),
      lead_(ranks.lead()),
      data_(std::move(setup.data)),
      tokenizer_(std::move(setup.tokenizer)),
      tokenizer_note_(std::move(setup.tokenizer_note)),
      preemption_(config.exit_duration_in_mins, setup.started) {
  connect_mesh(std::move(setup.plan));
  open_data();
  // Every rank validates the checkpoint alike (no collectives inside), so a mismatch is named by each rank
  // that sees it before any rank's exit can end the job.
  run_setup_on_all_ranks(*ranks_.world, [&] { resume_from_checkpoint(); });
  write_run_files();
  open_metrics_and_trace();
  prepare_steps();
}

// The communicators of the mesh axes, the engine over them, and this rank's share of every batch.
void Run::connect_mesh(TrainingPlan plan) {
  ranks_.axes = make_mesh_communicators(*ranks_.world, mesh_);
  engine_ = std::make_unique<Engine>(std::move(plan), EngineRanks{ranks_.world.get(), &ranks_.axes});
  const MeshGroup batch_ranks = mesh_group(mesh_, ranks_.world->rank(), kBatchMeshAxes);
  ranks_.batch_group =
      ranks_.world->split(static_cast<int>(batch_ranks.colour), static_cast<int>(batch_ranks.index), "batch");
  ranks_.data_rank = batch_ranks.index;
  ranks_.data_ranks = batch_ranks.size;
  ranks_.local_rows = engine_->spec().dims.B;
  ranks_.sequence_length = config_.max_target_length;
  const int64_t context = mesh_.size(MeshAxis::context);
  if (context > 1) {
    // plan_training has refused a length that does not split, on every rank alike, so this cannot throw.
    ranks_.context_layout.emplace(effective_context_reorder(config_), config_.max_target_length, context);
    ranks_.context_rank = mesh_coordinates(mesh_, ranks_.world->rank())[MeshAxis::context];
    const MeshGroup loss_ranks = mesh_group(mesh_, ranks_.world->rank(), kTokenMeshAxes);
    ranks_.loss_group =
        ranks_.world->split(static_cast<int>(loss_ranks.colour), static_cast<int>(loss_ranks.index), "loss");
  }
  if (mesh_.size(MeshAxis::stage) > 1) {
    const MeshGroup stage_ranks = mesh_group(mesh_, ranks_.world->rank(), MeshAxis::stage);
    ranks_.stage_group = ranks_.world->split(static_cast<int>(stage_ranks.colour),
                                             static_cast<int>(stage_ranks.index), "stage");
  }
  // Only the lead rank writes run_dir and prints; the others train silently.
  if (!lead_) {
    quiet_.reset(std::fopen("/dev/null", "w"));
    console_ = quiet_.get();
  }
}

// The train and eval loaders over the data source (one that needs preparing, such as text files to
// tokenize, is prepared by the lead rank while the others wait).
void Run::open_data() {
  if (data_->needs_preparing()) {
    if (lead_) data_->prepare(tokenizer_ ? &*tokenizer_ : nullptr);
    ranks_.world->barrier("data source prepared");
  }
  if (!config_.engram_layers.empty()) {
    engram_hashing_ = make_engram_hashing(engram_hash_options(config_), tokenizer_ ? &*tokenizer_ : nullptr);
    ranks_.engram_hashing = &*engram_hashing_;
  }
  const int32_t eos_id = tokenizer_ && tokenizer_->eos_id() ? *tokenizer_->eos_id() : -1;
  const LoaderOptions train = loader_options(config_, eos_id, Split::train, ranks_);
  loader_.emplace(data_->open(Split::train, train), train);
  if (config_.eval_interval > 0 && config_.eval_steps > 0) {
    const LoaderOptions eval = loader_options(config_, eos_id, Split::validation, ranks_);
    eval_loader_.emplace(data_->open(Split::validation, eval), eval);
  }
  tokenizer_identity_ = tokenizer_ ? tokenizer_->identity() : "";
}

// ", saved by 4 ranks (mesh data=2 fsdp=2), now 2 ranks (mesh data=2)" when the ranks differ from the
// checkpoint's, else "".
std::string Run::ranks_changed_since(const std::string& checkpoint) const {
  const nlohmann::json saved = saved_by_ranks(checkpoint);
  if (!saved.is_object() || !saved.contains("world_size") || !saved.contains("mesh")) return "";
  const int64_t saved_world = saved["world_size"].get<int64_t>();
  const std::string saved_mesh = saved["mesh"].get<std::string>();
  if (saved_world == ranks_.world->size() && saved_mesh == mesh_.to_string()) return "";
  return ", saved by " + std::to_string(saved_world) + " rank(s) (mesh " + saved_mesh + "), now " +
         std::to_string(ranks_.world->size()) + " rank(s) (mesh " + mesh_.to_string() + ")";
}

// The newest checkpoint of this run, else a full state or the parameters of another one, else nothing.
void Run::resume_from_checkpoint() {
  if (lead_) fs::create_directories(config_.run_dir);
  checkpoints_dir_ = config_.run_dir + "/checkpoints";
  if (!tokenizer_note_.empty()) std::fprintf(console_, "meshtrain: %s\n", tokenizer_note_.c_str());
  // prepare_run has checked the tokenizer (check_run_tokenizer), allow_tokenizer_change included.
  const std::string tokenizer_checked = "";
  if (const std::optional<std::string> latest = latest_checkpoint(checkpoints_dir_)) {
    state_ = load_checkpoint(*latest, *engine_, false, tokenizer_checked,
                             engram_hashing_ ? &*engram_hashing_ : nullptr);
    std::fprintf(console_, "resuming from %s (step %lld)%s\n", latest->c_str(),
                 static_cast<long long>(state_.step), ranks_changed_since(*latest).c_str());
  } else if (!config_.load_full_state_path.empty()) {
    state_ = load_checkpoint(config_.load_full_state_path, *engine_, false, tokenizer_checked,
                             engram_hashing_ ? &*engram_hashing_ : nullptr);
    loaded_elsewhere_ = true;
  } else if (!config_.load_parameters_path.empty()) {
    load_checkpoint(config_.load_parameters_path, *engine_, true, tokenizer_checked,
                    engram_hashing_ ? &*engram_hashing_ : nullptr);
  }
  if (!state_.data_cursor.is_null()) loader_->restore(state_.data_cursor, "checkpoint data cursor");
  summary_.first_step = state_.step;
  step_ = state_.step;
}

// The CPU, the matmul backend and the measured GEMM peak that mfu is relative to (lead rank: it alone
// writes metrics; measured after the engine set this rank's threads), the resolved config and the plan.
void Run::write_run_files() {
  // The plan this rank executes, in the format of meshtrain compile's plan_out (byte for byte the same):
  // run_dir/plan_<kernel>.json, or under mesh.stage > 1 each stage's own, plan_stage<s>_<kernel>.json,
  // written by the stage's first rank (every other coordinate 0; stage 0's is the lead).
  if (mesh_group(mesh_, ranks_.world->rank(), MeshAxis::stage).colour == 0) {
    fs::create_directories(config_.run_dir);
    const TrainingPlan& plan = engine_->plan();
    for (const KernelPlan& kernel : plan.kernels) {
      write_file_atomically(
          plan_file_path(plan_file_stem(config_.run_dir + "/plan", plan), kernel.kernel, kernel.chunk),
          serialize_kernel_plan(plan, kernel.kernel, kernel.chunk));
    }
  }
  if (!lead_) return;
  const bool bf16 = config_.dtype == DType::bf16;
  const TrainingPlan& plan = engine_->plan();
  if (plan.topology.device_kind != "cpu") {
    // A GPU: mfu is against the topology's stated peak; the device is named with its memory after the
    // arena was taken (total - free = the arena + the CUDA context and library workspaces).
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    std::fprintf(console_,
                 "device: %s; kernels %s; arena %.3f GiB as planned; mfu against %s's stated %.0f TFLOP/s\n",
                 engine_->backend().device_description().c_str(), engine_->backend().name,
                 static_cast<double>(plan.arena_bytes) / kGiB, plan.topology.name.c_str(),
                 plan.topology.rates(config_.dtype).peak_flops / 1e12);
  } else {
    machine_ = measure_machine(bf16, PeakTiming::brief_when_cached);
    std::fprintf(console_, "%s\n", machine_->describe().c_str());
  }
  if (machine_ && bf16 && machine_->gemm_bf16_peak_flops <= machine_->gemm_peak_flops) {
    std::fprintf(
        console_,
        "meshtrain: warning: this machine's bf16 GEMM (%.0f GFLOP/s) is not faster than its float32 GEMM "
        "(%.0f GFLOP/s): dtype=bfloat16 runs, but dtype=float32 trains at least as fast here\n",
        machine_->gemm_bf16_peak_flops / 1e9, machine_->gemm_peak_flops / 1e9);
  }
  write_resolved_config(config_, config_.run_dir);
  if (machine_) write_file_atomically(config_.run_dir + "/machine.json", machine_->to_json().dump(2) + "\n");
  const int64_t last_logged = MetricsLog::truncate_after(config_.run_dir + "/metrics.jsonl", state_.step);
  if (last_logged > state_.step) {
    std::fprintf(
        console_,
        "meshtrain: steps %lld..%lld were trained after the checkpoint and are lost (metrics.jsonl held "
        "them): training them again\n",
        static_cast<long long>(state_.step + 1), static_cast<long long>(last_logged));
  }
}

void Run::open_metrics_and_trace() {
  if (lead_) metrics_.emplace(config_.run_dir, true);
  trace_.emplace(config_.profiler == "trace" ? config_.profiler_steps : std::vector<int64_t>{},
                 ranks_.world->rank());
  engine_->set_trace(&*trace_);
}

// What every step reuses: checkpoint options, the figures of the metrics, the progress bar, the injected
// fault and the planned bytes per axis.
void Run::prepare_steps() {
  checkpoint_options_ = {tokenizer_ ? tokenizer_->source_path() : "", tokenizer_identity_,
                         config_.max_num_checkpoints_to_keep, engram_hashing_ ? &*engram_hashing_ : nullptr};
  tokens_per_step_ = static_cast<double>(loader_->global_batch_rows() * config_.max_target_length);
  // From here the prefetcher owns the train loader: the next step's batches are cut while this one trains.
  BatchPrefetcher::Options prefetch;
  prefetch.data_rank = static_cast<int>(ranks_.data_rank);
  prefetch.micro_batches = static_cast<int>(config_.gradient_accumulation_steps);
  prefetch.shape_for_rank = [this](Batch rows) { return ranks_.tokens_here(std::move(rows)); };
  prefetch.checksum = lead_;
  batches_.emplace(std::move(*loader_), std::move(prefetch));
  loader_.reset();
  step_flops_ = standard_training_flops(config_).total();
  // mfu: against this machine's measured GEMM peak, not a stated one (the `cpu` topology's 230 GFLOP/s is a
  // Zen 4 at AVX2 width; a Zen 5 or a Xeon with two AVX-512 units reaches twice that).
  // dtype=bfloat16: against the bf16 GEMM's measured peak.
  peak_flops_ = !machine_                      ? engine_->plan().topology.rates(config_.dtype).peak_flops
                : config_.dtype == DType::bf16 ? machine_->gemm_bf16_peak_flops
                                               : machine_->gemm_peak_flops;
  progress_.emplace(config_.steps, state_.step, console_);
  fault_ = injected_fault();
  raise_injected_signal(fault_, 0, ranks_.world->rank());
  schedule_ = learning_rate_schedule(config_);
  if (config_.skip_step_on_spikes) {
    spikes_.emplace(config_.skip_step_interval, config_.skip_step_scaling_factor);
    // A checkpoint saved without spike skipping holds no window: it fills again from here.
    if (state_.train_state.contains("skip_step"))
      spikes_->restore(state_.train_state["skip_step"], "checkpoint metadata.json: train_state.skip_step");
  }
  planned_step_bytes_ = nlohmann::json::object();
  for (const auto& [axis, bytes] : step_collective_bytes(engine_->plan())) planned_step_bytes_[axis] = bytes;
}

void Run::save(int64_t step, const nlohmann::json& data_cursor) {
  if (!config_.enable_checkpointing) return;
  state_.step = step;
  state_.data_cursor = data_cursor;
  state_.rng = {{"init_weights_seed", config_.init_weights_seed},
                {"data_shuffle_seed", config_.data_shuffle_seed}};
  if (spikes_) state_.train_state = {{"skip_step", spikes_->to_json()}};
  const auto start = std::chrono::steady_clock::now();
  summary_.last_checkpoint = save_checkpoint(checkpoints_dir_, *engine_, state_, checkpoint_options_);
  ranks_.world->barrier("checkpoint saved");  // no rank resumes (or looks for it) before it is committed
  if (!summary_.last_checkpoint.empty()) {
    // Parameters and both Adam moments, float32, one replica of each element whatever the mesh.
    const double gib = 3.0 * 4.0 * static_cast<double>(engine_->global_parameter_count()) / (1u << 30);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[160];
    std::snprintf(line, sizeof line,
                  "checkpoint step %lld: %.2f GiB from %d rank(s) in %.2f s (%.2f GiB/s), ",
                  static_cast<long long>(step), gib, ranks_.world->size(), seconds, gib / seconds);
    progress_->message(line + summary_.last_checkpoint);
  }
}

// The step's data from the prefetcher; the wait for it (when it is not ready yet) is the trace's data_wait.
PreparedStep Run::take_batches() {
  const double start_us = trace_->now_us();
  PreparedStep prepared = batches_->take();
  trace_->record("data_wait", "data", start_us, batches_->last_wait_seconds() * 1e6);
  return prepared;
}

// This rank's loss sums over the step's micro-batches: the program's gradients phase (gradients accumulated
// in the engine). The program reads each micro-batch once, so it takes them from `prepared`.
LossSums Run::run_micro_batches(int64_t rank, PreparedStep& prepared) {
  if (fault_.at("nan_gradient", step_ + 1, rank)) engine_->inject_nan_gradient();
  const MicroBatchSource take = [&prepared](int64_t micro) {
    return std::move(prepared.micro_batches.at(static_cast<size_t>(micro)));
  };
  const TraceScope phase(&*trace_, "gradients", "phase");  // a pipeline's bubble is measured inside it
  return engine_->run_program(engine_->plan().program.gradients, {take}).sums;
}

bool Run::skip_spike(int64_t step, double loss, double lm_loss, const PreparedStep& prepared) {
  const std::string reason = spikes_->spike_reason(loss);
  if (reason.empty()) {
    spikes_->record(loss, false);
    return false;
  }
  engine_->abandon_step();  // the reductions started during the last backward finish before anything reuses
                            // them
  const std::string where = "training step " + std::to_string(step + 1);
  const int64_t in_a_row = spikes_->skips_in_a_row() + 1;
  if (config_.skip_step_max_consecutive > 0 && in_a_row >= config_.skip_step_max_consecutive) {
    save(step, prepared.cursor);  // the state before this step (its window too): a restart trains it again
    fail(
        where,
        "at most skip_step_max_consecutive=" + std::to_string(config_.skip_step_max_consecutive) +
            " loss spikes in a row",
        std::to_string(in_a_row) + " in a row (steps " + std::to_string(step + 2 - in_a_row) + ".." +
            std::to_string(step + 1) + "), the last: " + reason,
        "the loss has moved for good: resume from an earlier checkpoint with a lower learning_rate, or raise "
        "skip_step_max_consecutive (0: no limit) to let the window take the new level");
  }
  spikes_->record(loss, true);
  if (metrics_) {
    nlohmann::json record = {
        {"step", step + 1}, {"loss", loss}, {"lm_loss", lm_loss}, {"skipped", "loss spike: " + reason}};
    if (prepared.batch_crc32c) record["batch_crc32c"] = batch_checksum_text(*prepared.batch_crc32c);
    metrics_->write(record);
  }
  progress_->message(where + ": loss spike, step skipped (" + reason + ")");
  ++step_;  // the prefetcher has moved on: the skipped batch is consumed
  return true;
}

StepOutcome Run::step(const RunControl& control) {
  const int64_t step = step_;
  // A signal reaches the ranks at different moments (or before the first step): they stop together, here.
  ranks_.world->set_context("the boundary before step " + std::to_string(step + 1));
  if (StopRequest stop = preemption_.agree(*ranks_.world)) {
    stop_ = std::move(stop);
    return StepOutcome::stopped;
  }
  Engine& engine = *engine_;
  const auto start = std::chrono::steady_clock::now();
  trace_->begin_step(step + 1);  // steps are numbered from 1, as in metrics.jsonl
  ranks_.world->set_context("step " + std::to_string(step + 1));
  const int64_t rank = ranks_.world->rank();
  engine.reset_collective_stats();
  if (fault_.at("stall", step + 1, rank))
    std::this_thread::sleep_for(std::chrono::duration<double>(fault_.value));
  // MESHTRAIN_FAULT=hold:STEP: every rank waits in step STEP until a stop signal has come, a step that
  // outlasts the scheduler's signal however late it is sent, so a test's signal always finds the run alive
  // (a 40-step tiny run can end before a poller on a loaded machine sends it) and it stops after STEP.
  if (fault_.kind == "hold" && fault_.step == step + 1) {
    while (stop_signal_received() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  raise_injected_signal(fault_, step + 1, rank);
  PreparedStep prepared = take_batches();
  const double data_wait_seconds = batches_->last_wait_seconds();
  LossSums local = run_micro_batches(rank, prepared);
  // Dies between the backward pass and the step's reductions: the other ranks are inside the step.
  if (fault_.at("kill", step + 1, rank)) std::raise(SIGKILL);
  if (fault_.at("nan_loss", step + 1, rank)) local.loss_sum = std::numeric_limits<double>::quiet_NaN();
  if (spike_injected(fault_, mesh_, step + 1, rank)) local.loss_sum *= 1000.0;
  // Every rank sees a non-finite loss of any rank before the optimizer step, and which rank it was.
  const bool bad_here = !std::isfinite(local.loss_sum) || !std::isfinite(local.z_loss_sum);
  int64_t lowest_bad =
      bad_here ? ranks_.world->size() - ranks_.world->rank() : 0;  // max picks the lowest rank
  ranks_.world->all_reduce(comm_buffer(&lowest_bad, 1), ReduceOp::max, "step/nonfinite_rank");
  const int64_t first_bad_rank = ranks_.world->size() - lowest_bad;
  const LossSums sums = sum_over_ranks(local, engine, ranks_, "step/loss_sums");
  const double lm_loss = sums.valid_count > 0 ? sums.loss_sum / static_cast<double>(sums.valid_count) : 0.0;
  const double balance_loss = sums.valid_count > 0 ? std::accumulate(sums.routing.balance_loss.begin(),
                                                                     sums.routing.balance_loss.end(), 0.0) /
                                                         static_cast<double>(sums.valid_count)
                                                   : 0.0;
  const double z_loss = sums.valid_count > 0 ? sums.z_loss_sum / static_cast<double>(sums.valid_count) : 0.0;
  const double loss = lm_loss + balance_loss + z_loss;  // the objective the gradients are of
  // Decided on the world-wide flag: a tensor peer of the bad rank sums only its own data x fsdp group.
  if (lowest_bad > 0 || !std::isfinite(loss)) {
    engine.abandon_step();  // the reductions started during the last backward finish before anything reuses
                            // them
    const std::string where = "training step " + std::to_string(step + 1) +
                              (ranks_.world->size() > 1 ? ", rank " + std::to_string(first_bad_rank) : "");
    if (!config_.skip_nonfinite_steps) {
      save(step, prepared.cursor);
      fail(where, "a finite loss", to_text(loss),
           "lower learning_rate, or set skip_nonfinite_steps=true to skip such steps");
    }
    progress_->message(where + ": non-finite loss, step skipped");
    ++step_;  // the prefetcher has moved on: the skipped batch is consumed
    return StepOutcome::skipped;
  }
  if (spikes_ && skip_spike(step, loss, lm_loss, prepared)) return StepOutcome::skipped;
  const double learning_rate = schedule_.at(step);
  const ProgramInputs update_inputs{
      .micro_batch = nullptr, .valid_count = local.valid_count, .learning_rate = learning_rate, .step = step};
  const UpdateResult update = engine.run_program(engine.plan().program.update, update_inputs).update;
  if (update.nonfinite) {  // a non-finite gradient: the update left every parameter unchanged
    if (!config_.skip_nonfinite_steps) {
      save(step, prepared.cursor);
      fail("training step " + std::to_string(step + 1), "finite gradients", "a non-finite gradient norm",
           "lower learning_rate, or set skip_nonfinite_steps=true to skip such steps");
    }
    progress_->message("step " + std::to_string(step + 1) + ": non-finite gradient, step skipped");
    ++step_;  // the prefetcher has moved on: the skipped batch is consumed
    return StepOutcome::skipped;
  }
  if (config_.routed_bias)
    engine.update_selection_biases(own_expert_loads(sums.routing.expert_load, engine),
                                   config_.routed_bias_update_rate);
  const double step_seconds = seconds_since(start);
  const double tokens_per_second = tokens_per_step_ / step_seconds;
  nlohmann::json record = {{"step", step + 1},
                           {"loss", loss},
                           {"lm_loss", lm_loss},
                           {"perplexity", std::exp(lm_loss)},
                           {"grad_norm", update.grad_norm},
                           {"raw_grad_norm", update.raw_grad_norm},
                           {"lr", learning_rate},
                           {"tokens_per_s", tokens_per_second},
                           {"tflops_per_device", step_flops_ / step_seconds / 1e12},
                           {"mfu", step_flops_ / step_seconds / peak_flops_},
                           {"step_time_s", step_seconds},
                           {"peak_memory_bytes", peak_resident_bytes()},
                           {"valid_tokens", sums.valid_count},
                           {"data_wait_s", data_wait_seconds},
                           {"data_wait_fraction", data_wait_seconds / step_seconds}};
  if (config_.z_loss_multiplier > 0.0) record["z_loss"] = z_loss;
  if (prepared.batch_crc32c) record["batch_crc32c"] = batch_checksum_text(*prepared.batch_crc32c);
  // The whole model's layers, whatever stage holds them (whole_model_sums).
  if (!engine.whole_model().moe_layers.empty()) record["moe"] = routing_metrics(engine.whole_model(), sums);
  if (!prepared.data_metrics.is_null()) record["data"] = std::move(prepared.data_metrics);
  if (ranks_.world->size() > 1) {
    // What the step's kernels moved per mesh axis (payload bytes per rank), next to what the plan says.
    nlohmann::json moved = nlohmann::json::object();
    for (const auto& [axis, bytes] : engine.collective_bytes()) moved[axis] = bytes;
    record["collective_bytes"] = moved;
    record["planned_collective_bytes"] = planned_step_bytes_;
  }
  if (eval_loader_ && (step + 1) % config_.eval_interval == 0) {
    summary_.last_eval_loss = evaluate(engine, *eval_loader_, config_.eval_steps, ranks_);
    record["eval"] = {{"loss", summary_.last_eval_loss}, {"perplexity", std::exp(summary_.last_eval_loss)}};
    progress_->message("step " + std::to_string(step + 1) + ": eval loss " +
                       to_text(summary_.last_eval_loss));
  }
  if (metrics_) metrics_->write(record);
  // Every rank's trace (a pipeline stage's idle time is its own): the lead's under the usual name, the
  // others' with their rank.
  if (trace_->active()) {
    const std::string rank_suffix = lead_ ? "" : "_rank" + std::to_string(ranks_.world->rank());
    trace_->write(config_.run_dir + "/trace_step" + std::to_string(step + 1) + rank_suffix + ".json");
  }
  summary_.last_loss = loss;
  progress_->update(step + 1, loss, tokens_per_second);
  const bool last = step + 1 == config_.steps;
  if (!last && config_.checkpoint_period > 0 && (step + 1) % config_.checkpoint_period == 0)
    save(step + 1, batches_->next_cursor());
  ++step_;
  if (step + 1 == control.stop_after_step) {
    stop_ = {StopReason::requested, "RunControl::stop_after_step", -1.0};
    return StepOutcome::stopped;
  }
  return StepOutcome::trained;
}

TrainingSummary Run::finish() {
  progress_->finish();
  summary_.steps_completed = step_;
  summary_.stop_reason = stop_.reason;
  if (stop_ && stop_.reason != StopReason::requested) {
    std::fprintf(
        console_, "meshtrain: stopping at the boundary before step %lld: %s%s\n",
        static_cast<long long>(step_ + 1), stop_.cause.c_str(),
        stop_.seconds_since_signal >= 0.0
            ? (" (the first rank's signal came " + seconds_text(stop_.seconds_since_signal) + " ago)").c_str()
            : "");
  }
  // With steps equal to a loaded state's step nothing trains and the state is saved into this run: that
  // converts a checkpoint to this run's mesh. A stop before any step saves nothing: the newest checkpoint
  // (or none) already holds that state.
  const bool trained = step_ > state_.step;
  if (trained || loaded_elsewhere_) save(step_, batches_->next_cursor());
  if (!stop_ || stop_.reason == StopReason::requested) return summary_;
  const int status = exit_status_for(stop_.reason);
  const std::string exit_text =
      "exit status " + std::to_string(status) + (status == kRequeueExitStatus ? " (requeue me)" : "");
  if (!trained && !loaded_elsewhere_) {
    std::fprintf(console_, "meshtrain: stopped before training any step: nothing to save (%s); %s\n",
                 state_.step > 0 ? ("a restart resumes from step " + std::to_string(state_.step)).c_str()
                                 : "a restart starts from step 0",
                 exit_text.c_str());
    return summary_;
  }
  if (!config_.enable_checkpointing) {
    std::fprintf(console_,
                 "meshtrain: stopped after step %lld without saving (enable_checkpointing=false): a restart "
                 "repeats the steps since its start; %s\n",
                 static_cast<long long>(step_), exit_text.c_str());
    return summary_;
  }
  const double since_signal = PreemptionWatch::seconds_since_first_signal(*ranks_.world);
  std::fprintf(console_, "meshtrain: stopped after step %lld: checkpoint %s committed%s; %s\n",
               static_cast<long long>(step_), summary_.last_checkpoint.c_str(),
               since_signal >= 0.0
                   ? (" " + seconds_text(since_signal) + " after the first rank's signal").c_str()
                   : "",
               exit_text.c_str());
  return summary_;
}

}  // namespace meshtrain
