// Plan identity: the config keys the table marks as plan keys (and, under pipeline stages, its pipeline plan
// keys), then the derived inputs (topology, mesh, threads), as "key=value" lines and their hash.
#include <cstdio>

#include "meshtrain/plan/passes.h"

namespace meshtrain {
namespace {

std::string fnv1a_hex(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

}  // namespace

std::string plan_identity_hash(const std::vector<std::pair<std::string, std::string>>& keys) {
  std::string text;
  for (const auto& [key, value] : keys) text += key + "=" + value + "\n";
  return fnv1a_hex(text);
}

PlanIdentity plan_identity(const Config& config, const Mesh& mesh, const Topology& topology,
                           int64_t threads) {
  PlanIdentity identity;
  std::vector<std::string> keys = plan_key_names();
  // The schedule and placement keys, and the stage axis (listed_mesh_axes), only under stages: a one-stage
  // plan's identity, and every plan file written before the pipeline keys existed, stay as they were.
  if (mesh.size(MeshAxis::stage) > 1) {
    for (const std::string& key : pipeline_plan_key_names()) keys.push_back(key);
  }
  // The optimizer's state and update ops are the plan's; opt_type is recorded when it is not adamw, so
  // every AdamW plan's identity (and plan files written before the key existed) stays as it was.
  if (config.opt_type != OptimizerType::adamw) keys.emplace_back("opt_type");
  for (const std::string& key : keys) {
    const auto found = std::find_if(config.resolved.begin(), config.resolved.end(),
                                    [&](const auto& entry) { return entry.first == key; });
    // Configs built in code (tests) have no resolved text: those keys are recorded empty.
    identity.keys.emplace_back(key, found == config.resolved.end() ? "" : found->second);
  }
  identity.keys.emplace_back("topology", topology.name);
  for (MeshAxis axis : listed_mesh_axes(mesh))
    identity.keys.emplace_back(std::string("mesh.") + mesh_axis_name(axis), std::to_string(mesh.size(axis)));
  identity.keys.emplace_back("threads", std::to_string(threads));
  identity.hash = plan_identity_hash(identity.keys);
  return identity;
}

}  // namespace meshtrain
