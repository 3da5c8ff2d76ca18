// The live engine: plans the run with the same plan_training() as `meshtrain compile`, allocates exactly
// the planned arena, initialises parameters from the counter-based RNG, and runs the kernels of
// shared/specs/training-step.md (fwd_bwd, fwd_bwd_accum, update, eval) in the planned op order, each op
// seeing its buffers at their planned offsets.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/core/arena.h"
#include "meshtrain/data/batch.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {

class TraceRecorder;

struct UpdateResult {
  double raw_grad_norm = 0.0;  // of the token-averaged gradient, before clipping
  double grad_norm = 0.0;      // after clipping
};

class Engine {
 public:
  // Plans the config for one process, checks that the CPU kernels can run it, allocates the arena and
  // initialises parameters.
  explicit Engine(const Config& config);
  // Runs an existing plan (one device).
  explicit Engine(TrainingPlan plan);

  LossSums fwd_bwd(const Batch& batch);        // first micro-batch: WRITES the gradients
  LossSums fwd_bwd_accum(const Batch& batch);  // later micro-batches: ADDS into the gradients
  // Divides the gradients by the global valid-token count, clips by global norm, steps AdamW.
  // `step` is 0-based; Adam's bias correction uses step + 1.
  UpdateResult update(int64_t global_valid_count, double learning_rate, int64_t step);
  LossSums eval(const Batch& batch);  // forward and loss only

  const ModelSpec& spec() const { return plan_.spec; }
  const TrainingPlan& plan() const { return plan_; }
  // A persistent buffer (parameters, gradients, optimizer state, batch), or a temporary's last value in
  // the kernel that ran last when nothing after it reused its memory (checked).
  TensorView view(BufferId id) const;
  size_t arena_bytes() const { return arena_.bytes(); }
  // Tests: fill the temporary region with NaN before every kernel, so an op that reads what it did not
  // declare (or what no earlier op wrote) shows up in the results.
  void set_poison_temporaries(bool poison) { poison_temporaries_ = poison; }
  // Re-initialises every parameter from (init_weights_seed, canonical name, element index); zeroes moments.
  void initialize_parameters();
  // Ops are recorded as trace events while the recorder is active (profiler=trace); null: off.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

 private:
  friend class PlannedOpContext;
  void load_batch(const Batch& batch);
  LossSums run(KernelName kernel, UpdateState* update = nullptr);

  TrainingPlan plan_;
  Arena arena_;
  TraceRecorder* trace_ = nullptr;
  const KernelPlan* last_kernel_ = nullptr;
  bool poison_temporaries_ = false;
  MeshCoordinates coordinates_;  // this rank's place on the mesh
};

}  // namespace meshtrain
