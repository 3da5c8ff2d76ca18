// Parameter groups (see groups.h).
#include "meshtrain/optim/groups.h"

#include <algorithm>

#include "meshtrain/model/layers/engram.h"

namespace meshtrain {

std::vector<ParameterGroup> parameter_groups(const Config& config) {
  std::vector<ParameterGroup> groups;
  groups.push_back({"default", nullptr, 1.0, config.adam_weight_decay, {ParameterRole::matrix}});
  if (!config.engram_layers.empty()) {
    std::vector<ParameterRole> decayed;
    if (config.engram_weight_decay > 0.0) decayed.push_back(ParameterRole::embedding);
    groups.push_back({"engram_tables",
                      [](const ParameterDecl& parameter) { return is_engram_table(parameter); },
                      config.engram_learning_rate_multiplier, config.engram_weight_decay, decayed});
  }
  return groups;
}

size_t group_of(const std::vector<ParameterGroup>& groups, const ParameterDecl& parameter) {
  for (size_t g = groups.size(); g-- > 1;) {
    if (groups[g].holds(parameter)) return g;
  }
  return 0;
}

bool decays(const ParameterGroup& group, const ParameterDecl& parameter) {
  return std::find(group.decayed_roles.begin(), group.decayed_roles.end(), parameter.role) !=
         group.decayed_roles.end();
}

}  // namespace meshtrain
