// Parameter groups as data: which parameters share a learning-rate multiplier and a weight-decay rate, and
// which of them decay (the mask, by what each parameter is: ParameterRole). Today two groups, the default
// one and Engram's tables; more groups (the recipes' weight-decay groups) are more entries of the list.
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
  std::vector<ParameterRole> decayed_roles;  // the mask: members of other roles never decay
};

// The groups of a run of `config`: default (adam_weight_decay on matrices only: no decay on norms, biases,
// embeddings), then, with Engram layers, their tables (engram_learning_rate_multiplier; decayed at
// engram_weight_decay only when it is above 0, the paper's 0 meaning none).
std::vector<ParameterGroup> parameter_groups(const Config& config);
// The index in `groups` of the group holding `parameter`: the last one whose rule holds it, else 0.
size_t group_of(const std::vector<ParameterGroup>& groups, const ParameterDecl& parameter);
// Whether `group`'s mask decays `parameter`.
bool decays(const ParameterGroup& group, const ParameterDecl& parameter);

}  // namespace meshtrain
