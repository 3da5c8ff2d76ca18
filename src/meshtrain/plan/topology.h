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

struct Topology {
  std::string name;         // as asked, e.g. "h100x64"
  std::string device_kind;  // e.g. "h100", "v5p", "cpu"
  int64_t num_devices = 0;  // 0: as many as the mesh asks (cpu entries)
  int64_t devices_per_host = 1;
  double memory_bytes = 0.0;  // per device; cpu entries: the whole host's (see device_memory_bytes)
  double peak_flops_float32 = 0.0, peak_flops_bfloat16 = 0.0;  // per device, dense GEMM FLOP/s
  double memory_bandwidth = 0.0;                               // per device, bytes/s
  // The rate each op kind runs at (plan/cost.cpp prices it so), per device and compute dtype: the dense
  // matmuls' FLOP/s at a model's shapes (the layers' and the loss's GEMMs), the attention ops' FLOP/s, the
  // logits per second of the loss's softmax part (everything of the fused unembedding + cross-entropy but its
  // GEMMs, per logit and GEMM pass), and the bytes per second the elementwise ops (norms, activations,
  // residual adds) move. Entries that do not state them price matmuls and attention at the GEMM peak, the
  // softmax at nothing and elementwise ops at memory_bandwidth.
  double matmul_flops_float32 = 0.0, matmul_flops_bfloat16 = 0.0;
  double attention_flops_float32 = 0.0, attention_flops_bfloat16 = 0.0;
  double loss_softmax_logits_float32 = 0.0, loss_softmax_logits_bfloat16 = 0.0;  // logits/s; 0: not priced
  double elementwise_bandwidth_float32 = 0.0, elementwise_bandwidth_bfloat16 = 0.0;  // bytes/s
  // Per device, per direction, bytes/s: within a host (NVLink, ICI, shared memory) and between hosts.
  double intra_host_bandwidth = 0.0, inter_host_bandwidth = 0.0;
  bool host_memory_shared = false;  // cpu: the ranks on a host divide its memory
  int64_t host_cores = 0;           // cpu: cores of this machine; 0 elsewhere

  double peak_flops(DType dtype) const {
    return dtype == DType::bf16 ? peak_flops_bfloat16 : peak_flops_float32;
  }
  double matmul_flops(DType dtype) const {
    return dtype == DType::bf16 ? matmul_flops_bfloat16 : matmul_flops_float32;
  }
  double attention_flops(DType dtype) const {
    return dtype == DType::bf16 ? attention_flops_bfloat16 : attention_flops_float32;
  }
  double loss_softmax_logits(DType dtype) const {
    return dtype == DType::bf16 ? loss_softmax_logits_bfloat16 : loss_softmax_logits_float32;
  }
  double elementwise_bandwidth(DType dtype) const {
    return dtype == DType::bf16 ? elementwise_bandwidth_bfloat16 : elementwise_bandwidth_float32;
  }
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
