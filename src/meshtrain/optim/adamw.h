// AdamW with decoupled weight decay (kernels' adamw_update): its moments and its step of one parameter.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/groups.h"
#include "meshtrain/optim/optimizer.h"

namespace meshtrain {

// First and second moment, in this order (their buffers' and checkpoint tensors' prefixes).
std::vector<std::string> adamw_moment_names();

// optimizer/adamw/<parameter>: the parameter's step from its gradient (the clip's scale applied), its
// moments and its group's learning-rate multiplier and decay (under opt_type=muon with Nesterov's first
// moment, as optax.contrib.muon); nothing on a step with a non-finite norm.
OpDecl adamw_step_op(const ModelSpec& spec, const Config& config, size_t parameter,
                     const ParameterState& state, const ParameterGroup& group);

}  // namespace meshtrain
