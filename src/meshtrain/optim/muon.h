// Muon (optax.contrib.muon, MaxText's opt_type=muon): its momentum and its step of one hidden weight
// matrix parameter, every [fan_in, fan_out] matrix of it on its own (an expert tensor's experts, a stacked
// parameter's layers), through kernels' muon_update.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/groups.h"
#include "meshtrain/optim/optimizer.h"

namespace meshtrain {

// Muon's one moment (its buffers' and checkpoint tensors' prefix).
std::vector<std::string> muon_moment_names();

// A Muon parameter's value seen as `batch` matrices [rows = fan_in, cols = fan_out] one after another: the
// layers and experts axes are the batch, then the parameter's input axes (ParameterDecl::input_axes) the
// rows and the rest the columns; a dim split over mesh.tensor at its whole size (the plan gathers it).
struct MuonMatrices {
  int64_t batch = 0, rows = 0, cols = 0;
};
MuonMatrices muon_matrices(const ModelSpec& spec, const ParameterDecl& parameter);

// The orthogonalised update's factor for a [rows, cols] matrix: muon_consistent_rms unset (MaxText's None)
// sqrt(max(1, cols / rows)), else muon_consistent_rms x sqrt(max(rows, cols)).
double muon_update_scale(const Config& config, int64_t rows, int64_t cols);

// optimizer/muon/<parameter>: the parameter's step from its gradient (the clip's scale applied), its
// momentum and its group's learning-rate multiplier and Muon decay, through `scratch`
// (muon_scratch_floats of its matrices); nothing on a step with a non-finite norm.
OpDecl muon_step_op(const ModelSpec& spec, const Config& config, size_t parameter,
                    const ParameterState& state, const ParameterGroup& group, BufferId scratch);

}  // namespace meshtrain
