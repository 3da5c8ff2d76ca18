// Parameter groups as data: which parameters share a learning-rate multiplier and a weight-decay rate, and
// which of them decay (the mask). A group's mask is its default, by what each parameter is (ParameterRole:
// today's rule, matrices only), then the user's patterns on canonical names (adamw_mask_include puts a
// tensor in, adamw_mask takes it out). Today two groups, the default one and Engram's tables; more groups
// are more entries of the list.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {

struct ParameterGroup {
  std::string name;  // "default", "engram_tables"
  // Which parameters it holds; the first group (default) holds every parameter no later group holds.
  std::function<bool(const ParameterDecl&)> holds;
  double learning_rate_multiplier = 1.0;     // the step's learning rate times this
  double weight_decay_rate = 0.0;            // the decoupled decay of the members the mask decays
  std::vector<ParameterRole> decayed_roles;  // the mask's default: members of other roles never decay
  // The roles Muon steps under opt_type=muon (each [fan_in, fan_out] matrix of them, one expert and one
  // layer at a time), at muon_weight_decay_rate; AdamW steps the group's other members.
  std::vector<ParameterRole> muon_roles;
  double muon_weight_decay_rate = 0.0;
  // The mask's patterns (ECMAScript regular expressions searched in a canonical per-layer name): a tensor
  // one of `excluded` matches never decays; else one `included` matches always does; else its role decides.
  std::vector<std::string> included, excluded;
};

// The groups of a run of `config`: default (adam_weight_decay on linear maps' weights only: no decay on
// norms, biases, embeddings; under opt_type=muon Muon steps its hidden matrices, ParameterRole::matrix, at
// muon_weight_decay), then, with Engram layers, their tables (engram_learning_rate_multiplier; decayed at
// engram_weight_decay only when it is above 0, the paper's 0 meaning none; AdamW always); every group's mask
// takes the patterns of adamw_mask_include and adamw_mask.
std::vector<ParameterGroup> parameter_groups(const Config& config);
// The index in `groups` of the group holding `parameter`: the last one whose rule holds it, else 0.
size_t group_of(const std::vector<ParameterGroup>& groups, const ParameterDecl& parameter);
// Whether `group` steps `parameter` with Muon.
bool steps_with_muon(const ParameterGroup& group, const ParameterDecl& parameter);
// Whether `group`'s mask decays the tensor of `parameter` named `canonical_name` (the parameter's own, or a
// stacked parameter's member's).
bool decays(const ParameterGroup& group, const ParameterDecl& parameter, const std::string& canonical_name);
// The canonical per-layer names of `spec`'s parameters (a stacked parameter's members one by one), in
// parameter order.
std::vector<std::string> canonical_tensor_names(const ModelSpec& spec);
// Each pattern of adamw_mask and adamw_mask_include must match one of `names` (the whole model's: a
// pipeline stage's chunk holds part): one that matches none is an error naming the key, the pattern and
// the closest names. Before anything is allocated.
void check_decay_patterns(const Config& config, const std::vector<std::string>& names);

}  // namespace meshtrain
