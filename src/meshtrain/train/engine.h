// The live engine: one arena sized from the spec before the first step, parameters initialised from the
// counter-based RNG, and the kernels of shared/specs/training-step.md (fwd_bwd, fwd_bwd_accum, update,
// eval) run as the spec's op lists.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/core/arena.h"
#include "meshtrain/data/batch.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/arena_plan.h"

namespace meshtrain {

class TraceRecorder;

struct UpdateResult {
  double raw_grad_norm = 0.0;  // of the token-averaged gradient, before clipping
  double grad_norm = 0.0;      // after clipping
};

class Engine {
 public:
  // Checks that the CPU kernels can run this config, sizes and allocates the arena, initialises parameters.
  explicit Engine(ModelSpec spec);

  LossSums fwd_bwd(const Batch& batch);        // first micro-batch: WRITES the gradients
  LossSums fwd_bwd_accum(const Batch& batch);  // later micro-batches: ADDS into the gradients
  // Divides the gradients by the global valid-token count, clips by global norm, steps AdamW.
  // `step` is 0-based; Adam's bias correction uses step + 1.
  UpdateResult update(int64_t global_valid_count, double learning_rate, int64_t step);
  LossSums eval(const Batch& batch);  // forward and loss only

  const ModelSpec& spec() const { return spec_; }
  TensorView view(BufferId id) const;
  size_t arena_bytes() const { return arena_.bytes(); }
  // Re-initialises every parameter from (init_weights_seed, canonical name, element index); zeroes moments.
  void initialize_parameters();
  // Ops are recorded as trace events while the recorder is active (profiler=trace); null: off.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

 private:
  void load_batch(const Batch& batch);
  LossSums run(const std::vector<const std::vector<OpDecl>*>& op_lists);
  void zero_gradients();

  ModelSpec spec_;
  ArenaPlan plan_;
  Arena arena_;
  TraceRecorder* trace_ = nullptr;
};

}  // namespace meshtrain
