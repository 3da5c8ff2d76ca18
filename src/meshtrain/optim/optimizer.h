// The optimizer as a pass over a training spec's parameters: it puts them in groups (groups.h), declares the
// state it keeps beside each one from the outside (its moments, and a master copy in mu_dtype when weights
// are stored narrower, weight_dtype != mu_dtype), and the update kernel's ops: the step counter, each
// parameter's squared gradient norm, the clip by the global norm, and the optimizer's step per parameter.
// plan_training applies it to the spec it builds for training (`meshtrain compile` and the live engine
// alike); a decode spec has none. Whoever needs a parameter's moments (plan storage, the engine, checkpoints)
// asks the state table it returns. AdamW (adamw.h) and Muon (muon.h) are files beside it, each with its
// moment names and step op; the groups' data says which steps a parameter (opt_type=muon: Muon for hidden
// matrices).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/groups.h"

namespace meshtrain {

// What the optimizer keeps for one parameter.
struct ParameterState {
  size_t group = 0;   // in OptimizerDecl::groups
  bool muon = false;  // stepped by Muon (optim/muon.h), else by AdamW (optim/adamw.h)
  // Its group's mask applied to each of its tensors: one flag, or a stacked parameter's members' in layer
  // order (the mask's patterns see per-layer names, so layers of one stack may differ).
  std::vector<bool> weight_decay;
  // Its optimizer's moments ("adam_m", "adam_v"; or "muon_mu"), each at the value's shape (a stacked
  // parameter's: [layers, ...]), zero at the start of a run; checkpoints hold them.
  std::vector<std::string> moment_names;
  std::vector<BufferId> moments;  // parallel to moment_names
  BufferId master = kNoBuffer;    // only planned: a live run keeps weights in float32
};

// The optimizer pass's result: its state table and its ops.
struct OptimizerDecl {
  // Every moment name of the run's optimizer (AdamW's, then Muon's under opt_type=muon): buffers and
  // checkpoint tensors "<moment>/<parameter name>"
  std::vector<std::string> moment_names;
  std::vector<ParameterGroup> groups;      // parameter_groups(config)
  std::vector<ParameterState> parameters;  // parallel to ModelSpec::parameters; empty: no optimizer (decode)
  BufferId step_counter = kNoBuffer;       // [1] int32
  BufferId muon_scratch = kNoBuffer;       // the Muon ops' Newton-Schulz scratch (none without Muon)
  std::vector<OpDecl> update;  // the update kernel's ops in order (its collectives are the plan's)

  const ParameterState& state(size_t parameter) const { return parameters.at(parameter); }
};

// The moments the run's optimizer keeps, by name ("adam_m", "adam_v", and under opt_type=muon "muon_mu");
// also for an engine without an optimizer (a decode engine checks a training checkpoint's tensor names
// against them).
std::vector<std::string> optimizer_moment_names(const Config& config);
// Every moment name of every optimizer (a parameters-only load passes over those of a checkpoint of either).
std::vector<std::string> every_moment_name();
// The moments `config`'s optimizer keeps for `parameter` (of the whole model: checkpoints ask).
std::vector<std::string> parameter_moment_names(const Config& config, const ParameterDecl& parameter);

// Which tensors are in which group, as `meshtrain info` prints it: a line per group, optimizer and decay
// with its learning-rate multiplier and the tensors' canonical names, the layers of one name folded
// ("decoder/layers_{0-27}/mlp/wo/kernel").
std::string optimizer_groups_text(const ModelSpec& spec, const OptimizerDecl& optimizer);

// The pass over a training spec built from `config`: declares after the spec's own buffers each parameter's
// moments and master copy (parameter by parameter), then the step counter, and returns them with the groups
// and the update ops.
OptimizerDecl apply_optimizer(ModelSpec& spec, const Config& config);

}  // namespace meshtrain
