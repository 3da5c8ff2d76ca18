// Parameter groups (see groups.h).
// GCC 12 at -O1 (the sanitizer build) reports std::regex's internals as maybe-uninitialized (a false
// positive, GCC bug 105562); warnings are errors, so that one warning is off in this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "meshtrain/optim/groups.h"

#include <algorithm>
#include <regex>

#include "meshtrain/core/error.h"
#include "meshtrain/model/layers/engram.h"

namespace meshtrain {
namespace {

bool any_matches(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return std::regex_search(name, std::regex(pattern));
  });
}

// Up to `count` of `names` that `pattern` comes closest to occurring in (edits to occur anywhere in a name:
// 'q_norm' is 1 edit from '.../query_norm/scale', 'layers_0/mlp/wo_kernel' 1 from
// 'decoder/layers_0/mlp/wo/kernel'), closest first (ties in the model's
// order), for an error's hint.
std::vector<std::string> closest_names(const std::string& pattern, std::vector<std::string> names,
                                       size_t count) {
  std::vector<size_t> edits;
  for (const std::string& name : names) edits.push_back(edit_distance(pattern, name, /*anywhere=*/true));
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return edits[a] < edits[b]; });
  std::vector<std::string> closest;
  for (size_t i = 0; i < std::min(count, order.size()); ++i) closest.push_back(names[order[i]]);
  return closest;
}

}  // namespace

std::vector<ParameterGroup> parameter_groups(const Config& config) {
  std::vector<ParameterGroup> groups;
  ParameterGroup default_group;
  default_group.name = "default";
  default_group.weight_decay_rate = config.adam_weight_decay;
  // Every linear map's weights decay (this engine's rule since its start); Muon takes the hidden ones.
  default_group.decayed_roles = {ParameterRole::matrix, ParameterRole::head, ParameterRole::router,
                                 ParameterRole::mixing, ParameterRole::convolution};
  if (config.opt_type == OptimizerType::muon) {
    default_group.muon_roles = {ParameterRole::matrix};
    default_group.muon_weight_decay_rate = config.muon_weight_decay;
  }
  groups.push_back(std::move(default_group));
  if (!config.engram_layers.empty()) {
    std::vector<ParameterRole> decayed;
    if (config.engram_weight_decay > 0.0) decayed.push_back(ParameterRole::embedding);
    ParameterGroup tables;
    tables.name = "engram_tables";
    tables.holds = [](const ParameterDecl& parameter) { return is_engram_table(parameter); };
    tables.learning_rate_multiplier = config.engram_learning_rate_multiplier;
    tables.weight_decay_rate = config.engram_weight_decay;
    tables.decayed_roles = decayed;
    groups.push_back(std::move(tables));
  }
  for (ParameterGroup& group : groups) {
    group.included = config.adamw_mask_include;
    group.excluded = config.adamw_mask;
  }
  return groups;
}

size_t group_of(const std::vector<ParameterGroup>& groups, const ParameterDecl& parameter) {
  for (size_t g = groups.size(); g-- > 1;) {
    if (groups[g].holds(parameter)) return g;
  }
  return 0;
}

bool steps_with_muon(const ParameterGroup& group, const ParameterDecl& parameter) {
  return std::find(group.muon_roles.begin(), group.muon_roles.end(), parameter.role) !=
         group.muon_roles.end();
}

bool decays(const ParameterGroup& group, const ParameterDecl& parameter, const std::string& canonical_name) {
  if (any_matches(group.excluded, canonical_name)) return false;
  if (any_matches(group.included, canonical_name)) return true;
  return std::find(group.decayed_roles.begin(), group.decayed_roles.end(), parameter.role) !=
         group.decayed_roles.end();
}

std::vector<std::string> canonical_tensor_names(const ModelSpec& spec) {
  std::vector<std::string> names;
  for (const ParameterDecl& parameter : spec.parameters) {
    if (!parameter.stacked()) names.push_back(parameter.canonical_name);
    for (const ParameterDecl::Member& member : parameter.members) names.push_back(member.canonical_name);
  }
  return names;
}

void check_decay_patterns(const Config& config, const std::vector<std::string>& names) {
  for (const auto& [key, patterns] :
       {std::pair<const char*, const std::vector<std::string>&>{"adamw_mask", config.adamw_mask},
        {"adamw_mask_include", config.adamw_mask_include}}) {
    for (const std::string& pattern : patterns) {
      const std::regex compiled(pattern);
      if (std::any_of(names.begin(), names.end(),
                      [&](const std::string& name) { return std::regex_search(name, compiled); }))
        continue;
      std::string close;
      for (const std::string& name : closest_names(pattern, names, 3))
        close += (close.empty() ? "" : ", ") + name;
      fail(
          std::string("config key '") + key + "'",
          "patterns that each match a tensor's canonical name (a regular expression searched in the name)",
          "'" + pattern + "', which matches none of the model's " + std::to_string(names.size()) + " tensors",
          "the closest names: " + close + " (meshtrain info lists every tensor by group)");
    }
  }
}

}  // namespace meshtrain
