// The sharding pass: the rules that map each logical axis of a buffer (batch, length, embed, heads, kv_heads,
// head_dim, mlp, vocab, positions) onto mesh axes (config keys logical_axis_rules.*). The model is declared
// at per-device (local) sizes that this pass computes, so every op's FLOPs and every buffer's bytes are
// already per device.
//
// Two layouts: the compute layout (what an op sees: batch over data x fsdp, length over context, heads /
// kv_heads / mlp / vocab over tensor) and, for parameters and their gradients and optimizer state, the
// storage layout, which adds `fsdp` (and, for optimizer state under ZeRO-1, `data`) on one more dim.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/core/tensor.h"
#include "meshtrain/mesh/mesh.h"

namespace meshtrain {

// Mesh axes of one dim of one buffer: an ordered subset of kMeshAxes; degree = product of their sizes.
struct DimSharding {
  std::vector<MeshAxis> axes;
  int64_t degree = 1;
};

// The element of the global (unsharded) tensor that each local element of a sharded buffer holds, so every
// mesh initialises and checkpoints the same values. A dim split over several axes is split over the first
// one first. `global_dims` are the unsharded sizes; a dim whose global size is smaller than local x degree
// is replicated in groups (kv heads when the tensor degree exceeds them).
class GlobalIndex {
 public:
  GlobalIndex(const Shape& local, const std::vector<DimSharding>& sharding,
              const std::vector<int64_t>& global_dims, const Mesh& mesh, const MeshCoordinates& coordinates);
  int64_t operator()(int64_t local_flat) const;
  // The local tensor is the box of the global one that starts at offsets() and spans local_dims().
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::vector<int64_t>& local_dims() const { return local_dims_; }

 private:
  std::vector<int64_t> local_dims_, offsets_, global_strides_;
};

// A buffer's sharding: the mesh axes of each dim (compute layout plus what storage adds), and the per-device
// shape it is stored at.
struct TensorSharding {
  std::vector<DimSharding> dims;
  Shape local;
};

// The result of the pass for one model on one mesh.
class ShardingLayout {
 public:
  ShardingLayout() = default;  // one device: nothing sharded
  // `rules`: logical axis -> mesh axis names, tried in order (config keys logical_axis_rules.*, which the
  // errors name).
  ShardingLayout(const std::map<std::string, std::vector<std::string>>& rules, const Mesh& mesh);

  const Mesh& mesh() const { return mesh_; }
  // Compute-layout sharding of a logical axis (same for every buffer that has it); unknown axes
  // ("rows", "floats") are not sharded.
  const DimSharding& compute(const std::string& logical_axis) const;
  // The compute layout of a buffer declared at per-device shape `local_shape` (nothing added).
  TensorSharding compute_layout(const Shape& local_shape) const;
  // Storage layout of a parameter-family tensor declared at per-device compute shape `local_shape`: adds
  // fsdp to the first dim the rules give fsdp (else the first dim not sharded over tensor) whose size fsdp
  // divides; under ZeRO-1 (`over_data`) also data, to the first such dim whose (fsdp-local) size data
  // divides (training-step.md). No dividing dim: replicated over that axis.
  TensorSharding storage_layout(const Shape& local_shape, bool over_data) const;
  // Size of `logical_axis` per device in the compute layout (checked to divide; errors name the key).
  int64_t local_size(const std::string& logical_axis, int64_t global_size) const;

 private:
  Mesh mesh_;
  std::map<std::string, std::vector<MeshAxis>> rules_;
  std::map<std::string, DimSharding> compute_;
};

}  // namespace meshtrain
