// One training run on this rank: set-up in named phases (the plan agreed on every rank, then the mesh and
// engine, data, resume, run files, metrics) and step(), one optimizer step. run_training (trainer.h) makes
// a Run and calls step() until it says to stop.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/process_placement.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/context_reorder.h"
#include "meshtrain/data/engram_hash.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/data/prefetch.h"
#include "meshtrain/data/source.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/metrics/metrics.h"
#include "meshtrain/metrics/progress.h"
#include "meshtrain/metrics/trace.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/runtime/engram_inputs.h"
#include "meshtrain/train/machine.h"
#include "meshtrain/train/preemption.h"
#include "meshtrain/train/schedule.h"
#include "meshtrain/train/spike_skip.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

// The ranks a run spans: the world, one communicator per mesh axis, and this rank's share of the batch.
struct RunRanks {
  std::unique_ptr<Communicator> world;
  MeshCommunicators axes;
  std::unique_ptr<Communicator>
      batch_group;        // the data x fsdp ranks that share this rank's tensor/context place
  int64_t data_rank = 0;  // which slice of every micro-batch: data x fsdp ranks see different rows
  int64_t data_ranks = 1;
  int64_t local_rows = 0;  // rows of one micro-batch on this rank
  // The data x fsdp x context ranks whose loss sums add up to the step's (context ranks hold different
  // tokens of the same rows); the batch group itself when mesh.context is 1.
  std::unique_ptr<Communicator> loss_group;
  // mesh.stage > 1: the stage ranks of this rank's place, the last of which computes the loss sums (each
  // stage rank counts the valid tokens itself).
  std::unique_ptr<Communicator> stage_group;
  // mesh.context > 1: how each row is laid over the context ranks, and this rank's place on that axis.
  std::optional<ContextLayout> context_layout;
  int64_t context_rank = 0;
  // Engram: the run's hashing (null without Engram), applied to natural-order rows of sequence_length.
  const EngramHashing* engram_hashing = nullptr;
  int64_t sequence_length = 0;
  // This rank's part of a micro-batch the loader cut for this batch group ([B, S] rows, [B, S / C] here),
  // with its Engram hash ids, hashed before the context cut permutes the rows.
  Batch tokens_here(Batch rows) const {
    if (engram_hashing != nullptr) engram_hashing->add_to(rows, sequence_length);
    return context_layout ? context_shard(rows, *context_layout, context_rank) : rows;
  }
  bool lead() const { return world->rank() == 0; }  // writes run_dir, prints, checkpoints
};

// What set-up finds before any rank talks to another: every rank computes it alike, so its errors are
// printed by every rank (run_setup_on_all_ranks).
struct RunSetup {
  std::unique_ptr<DataSource> data;  // the dataset_type's source (its train split resolved)
  TrainingPlan plan;
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_note;  // check_run_tokenizer's note or warning on the checkpoint the run starts from
  // When set-up began: exit_duration_in_mins counts from here.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// The checks and the plan of set-up's first phase: steps, the data source, the plan (and a plan_in
// matching it), the tokenizer (and that the checkpoint the run starts from was trained with it).
// `placement`: this rank's threads and who started the ranks (nullptr: one process, the plan's threads).
RunSetup prepare_run(const Config& config, int64_t world_size, int64_t rank = 0,
                     const ProcessPlacement* placement = nullptr);

// A run resuming a full state (its run_dir's newest checkpoint, else load_full_state_path) keeps the global
// batch its data cursor records: gradient_accumulation_steps becomes G / (per_device_batch_size x
// world_size), so the loader reads the rows the saved run would have read whatever the new mesh. Called
// before the plan; returns a line saying what was derived ("" when the config's value stands or there is no
// such cursor: older checkpoints, weights only). A world size that cannot divide G is a MeshError naming the
// numbers and the fix.
std::string keep_checkpoint_global_batch(Config& config, int64_t world_size);

// Every rank must run the same code with the same config: a mismatch would hang or corrupt collectives. The
// identity is CRC-32C of the resolved config and of process_code_files()' contents.
uint64_t run_identity(const Config& config);
// The files of this process's code: /proc/self/exe, then the meshtrain libraries it has loaded in the order
// of their names (each folder of src/meshtrain is a shared library, so the executable alone holds little
// more than main()).
std::vector<std::string> process_code_files();

// Test-only fault injection, MESHTRAIN_FAULT=KIND:STEP:RANK[:VALUE] (KIND nan_loss, nan_gradient, stall
// for VALUE seconds, kill: SIGKILL after the step's backward pass, sigusr1 / sigterm: the rank signals itself
// during the step, STEP 0 during set-up, or spike_loss: rank RANK's loss x 1000 in VALUE steps in a row from
// STEP, default 1): the failure tests of distributed runs make one rank misbehave at one step.
struct InjectedFault {
  std::string kind;
  int64_t step = -1, rank = -1;
  double value = 0.0;
  bool at(const char* what, int64_t now, int64_t this_rank) const {
    return kind == what && step == now && rank == this_rank;
  }
};

// What one call of Run::step() did.
enum class StepOutcome {
  trained,  // an optimizer step (its metrics written)
  skipped,  // a non-finite loss or gradient with skip_nonfinite_steps, or a loss spike with
            // skip_step_on_spikes: no update, the batch consumed
  stopped,  // every rank agreed to stop before this step (a signal, the time limit), or RunControl ended the
            // run after it
};

class Run {
 public:
  // Runs every set-up phase after prepare_run, in order; `ranks.world` exists, the rest is filled here.
  Run(const Config& config, RunSetup setup, std::FILE* console, RunRanks& ranks);

  bool steps_left() const { return step_ < config_.steps; }
  // One optimizer step: the agreed stop check at the boundary before it (a stop trains nothing), the
  // micro-batches, the agreed non-finite check, the spike check, the update, metrics, eval, trace, progress,
  // a periodic checkpoint.
  StepOutcome step(const RunControl& control);
  // The final save (when anything trained or a state was loaded from elsewhere), what a stop did (the time
  // from the signal to the committed checkpoint) and the summary.
  TrainingSummary finish();

 private:
  // Set-up phases, in the order the constructor runs them.
  void connect_mesh(TrainingPlan plan);
  void open_data();
  void resume_from_checkpoint();
  std::string ranks_changed_since(const std::string& checkpoint) const;
  void write_run_files();
  void open_metrics_and_trace();
  void prepare_steps();

  PreparedStep take_batches();
  LossSums run_micro_batches(int64_t rank, PreparedStep& prepared);
  // skip_step_on_spikes: whether the step's global loss is a spike (then it is logged and skipped, or the run
  // stops after skip_step_max_consecutive of them in a row); the loss enters the window either way.
  bool skip_spike(int64_t step, double loss, double lm_loss, const PreparedStep& prepared);
  // `data_cursor`: the position of the next step to train (the step that failed, or the prefetcher's next).
  void save(int64_t step, const nlohmann::json& data_cursor);

  const Config& config_;
  RunRanks& ranks_;
  Mesh mesh_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet_;  // the console of ranks other than the lead
  std::FILE* console_;
  bool lead_;
  std::unique_ptr<DataSource> data_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<EngramHashing> engram_hashing_;  // set by open_data when the model has Engram layers
  std::string tokenizer_note_;                   // printed when the run loads its checkpoint
  std::string tokenizer_identity_;
  std::optional<BatchLoader> loader_;       // set by open_data; handed to batches_ by prepare_steps
  std::optional<BatchPrefetcher> batches_;  // the train loader's batches, a step ahead
  std::optional<BatchLoader> eval_loader_;
  std::string checkpoints_dir_;
  TrainingSummary summary_;
  CheckpointState state_;
  bool loaded_elsewhere_ =
      false;  // a full state from load_full_state_path (another run, perhaps another mesh)
  std::optional<MachineReport> machine_;
  std::optional<MetricsLog> metrics_;
  std::optional<TraceRecorder> trace_;
  CheckpointOptions checkpoint_options_;
  double tokens_per_step_ = 0.0;
  double step_flops_ = 0.0;
  double peak_flops_ = 0.0;
  std::optional<ProgressBar> progress_;
  PreemptionWatch preemption_;
  StopRequest stop_;  // why step() stopped the run, if it did
  InjectedFault fault_;
  LearningRateSchedule schedule_;
  std::optional<LossSpikeWindow> spikes_;  // skip_step_on_spikes only
  nlohmann::json planned_step_bytes_;      // per mesh axis: what one step's kernels move, as planned
  int64_t step_ = 0;                       // optimizer steps done
};

}  // namespace meshtrain
