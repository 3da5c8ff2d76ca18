// Named hardware topologies from configs/topologies.yaml: device peaks and memory, read as stated (never
// measured at run time, so plans are deterministic).
#pragma once

#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

struct Topology {
  std::string name;
  std::string device_kind;
  int64_t devices_per_host = 1;
  double memory_bytes = 0.0;
  double peak_flops_float32 = 0.0, peak_flops_bfloat16 = 0.0;  // per device, FLOP/s
  double memory_bandwidth = 0.0;                                // bytes/s
  double peak_flops(DType dtype) const { return dtype == DType::bf16 ? peak_flops_bfloat16 : peak_flops_float32; }
};

// Loads `name` from configs/topologies.yaml; an unknown name lists the valid ones.
Topology load_topology(const std::string& name, const std::string& config_dir = "");
std::vector<std::string> topology_names(const std::string& config_dir = "");

}  // namespace meshtrain
