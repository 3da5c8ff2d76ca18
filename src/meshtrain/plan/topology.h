// Named hardware topologies (shared/specs/aot-plan.md): configs/topologies.yaml, plus an optional user YAML
// (config key topologies_path) whose entries add to or replace the built-in ones. Device peaks are read as
// stated, never measured at run time, so plans are deterministic; for `cpu` entries only the core count and
// total memory come from the running machine.
//
// Names: a device family with a count pattern (`h100x8`, `h100x64`, `mi300xx16`, `v5p-8` = 4 chips,
// `v6e-4`, `v5e-16`) or a fixed entry (`cpu`, whose device count is whatever the mesh asks for: ranks on
// one host sharing its memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

// What one device does per second in one compute dtype; plan/cost.cpp prices each op kind at its rate: the
// dense GEMM peak, the dense matmuls at a model's shapes (the layers' and the loss's GEMMs), the attention
// ops, the logits of the loss's softmax part (everything of the fused unembedding + cross-entropy but its
// GEMMs, per logit and GEMM pass) and the bytes the elementwise ops (norms, activations, residual adds) move.
// Entries that do not state the last four price matmuls and attention at the GEMM peak, the softmax at
// nothing and elementwise ops at memory_bandwidth.
struct ComputeRates {
  double peak_flops = 0.0;             // dense GEMM FLOP/s
  double matmul_flops = 0.0;           // FLOP/s
  double attention_flops = 0.0;        // FLOP/s
  double loss_softmax_logits = 0.0;    // logits/s; 0: not priced
  double elementwise_bandwidth = 0.0;  // bytes/s
};

struct Topology {
  std::string name;         // as asked, e.g. "h100x64"
  std::string device_kind;  // e.g. "h100", "v5p", "cpu"
  int64_t num_devices = 0;  // 0: as many as the mesh asks (cpu entries)
  int64_t devices_per_host = 1;
  double memory_bytes = 0.0;       // per device; cpu entries: the whole host's (see device_memory_bytes)
  ComputeRates float32, bfloat16;  // per device, by compute dtype
  double memory_bandwidth = 0.0;   // per device, bytes/s
  // Per device, per direction, bytes/s: within a host (NVLink, ICI, shared memory) and between hosts.
  double intra_host_bandwidth = 0.0, inter_host_bandwidth = 0.0;
  bool host_memory_shared = false;  // cpu: the ranks on a host divide its memory
  int64_t host_cores = 0;           // cpu: cores of this machine; 0 elsewhere

  const ComputeRates& rates(DType dtype) const { return dtype == DType::bf16 ? bfloat16 : float32; }
  // Memory one device (rank) may use when `devices` devices run: cpu hosts are divided among their ranks.
  double device_memory_bytes(int64_t devices) const;
  // Bandwidth of a collective over a group whose members are `stride` devices apart (tensor is innermost,
  // so its stride is 1): within one host when the group spans at most devices_per_host devices.
  double link_bandwidth(int64_t group_size, int64_t stride) const;
};

// Loads `name` from the built-in catalog (config_dir/topologies.yaml) and then `user_catalog` (may be empty).
// An unknown name, or a count that does not fit the family's pattern, is an error listing the valid names.
Topology load_topology(const std::string& name, const std::string& user_catalog = "",
                       const std::string& config_dir = "");
// Every valid name form, e.g. "cpu", "h100xN (N = 1, 2, 4, 8, 16, ...)", "v5p-N (N even)".
std::vector<std::string> topology_names(const std::string& user_catalog = "",
                                        const std::string& config_dir = "");

}  // namespace meshtrain
