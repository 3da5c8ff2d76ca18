#include "meshtrain/plan/topology.h"

#include <yaml-cpp/yaml.h>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

YAML::Node load_catalog(const std::string& config_dir) {
  const std::string path = (config_dir.empty() ? config_directory() : config_dir) + "/topologies.yaml";
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& error) {
    fail(path, "a readable YAML topology catalog", error.what());
  }
}

}  // namespace

std::vector<std::string> topology_names(const std::string& config_dir) {
  std::vector<std::string> names;
  for (const auto& entry : load_catalog(config_dir)) names.push_back(entry.first.as<std::string>());
  return names;
}

Topology load_topology(const std::string& name, const std::string& config_dir) {
  const YAML::Node catalog = load_catalog(config_dir);
  const YAML::Node entry = catalog[name];
  if (!entry) {
    std::string valid;
    for (const std::string& candidate : topology_names(config_dir)) valid += (valid.empty() ? "" : ", ") + candidate;
    fail("config key 'topology'", "one of: " + valid, "'" + name + "'",
         "did you mean '" + closest_name(name, topology_names(config_dir)) + "'?");
  }
  try {
    Topology topology;
    topology.name = name;
    topology.device_kind = entry["device_kind"].as<std::string>();
    topology.devices_per_host = entry["devices_per_host"].as<int64_t>();
    topology.memory_bytes = entry["memory_gib"].as<double>() * 1024.0 * 1024.0 * 1024.0;
    topology.peak_flops_float32 = entry["peak_tflops"]["float32"].as<double>() * 1e12;
    topology.peak_flops_bfloat16 = entry["peak_tflops"]["bfloat16"].as<double>() * 1e12;
    topology.memory_bandwidth = entry["memory_bandwidth_gbs"].as<double>() * 1e9;
    return topology;
  } catch (const YAML::Exception& error) {
    fail("topology '" + name + "' in topologies.yaml",
         "device_kind, devices_per_host, memory_gib, peak_tflops.{float32,bfloat16}, memory_bandwidth_gbs", error.what());
  }
}

}  // namespace meshtrain
