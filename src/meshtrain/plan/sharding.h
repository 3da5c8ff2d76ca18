// The sharding pass: the device mesh, and the rules that map each logical axis of a buffer (batch, length,
// embed, heads, kv_heads, head_dim, mlp, vocab, positions) onto mesh axes (config keys
// logical_axis_rules.*). The model is declared at per-device (local) sizes that this pass computes, so every
// op's FLOPs and every buffer's bytes are already per device.
//
// Two layouts: the compute layout (what an op sees: batch over data x fsdp, length over context, heads /
// kv_heads / mlp / vocab over tensor) and, for parameters and their gradients and optimizer state, the
// storage layout, which adds `fsdp` (and, for optimizer state under ZeRO-1, `data`) on one more dim.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {

enum class MeshAxis { data, fsdp, context, tensor };
inline constexpr std::array<MeshAxis, 4> kMeshAxes = {MeshAxis::data, MeshAxis::fsdp, MeshAxis::context,
                                                      MeshAxis::tensor};
const char* mesh_axis_name(MeshAxis axis);

// The member `axis` names in any struct with one member per mesh axis (MeshShape, Mesh, MeshCoordinates).
template <class PerAxis>
auto& axis_member(PerAxis& values, MeshAxis axis) {
  switch (axis) {
    case MeshAxis::data:
      return values.data;
    case MeshAxis::fsdp:
      return values.fsdp;
    case MeshAxis::context:
      return values.context;
    case MeshAxis::tensor:
      break;
  }
  return values.tensor;
}

// A resolved mesh: every axis >= 1, product = devices. Axes outermost first: tensor is innermost.
struct Mesh {
  int64_t data = 1, fsdp = 1, context = 1, tensor = 1;

  int64_t size(MeshAxis axis) const { return axis_member(*this, axis); }
  int64_t devices() const { return data * fsdp * context * tensor; }
  // Distance in device index between neighbours of a group along `axis` (tensor: 1).
  int64_t stride(MeshAxis axis) const;
  std::string to_string() const;  // "data=2 fsdp=1 context=1 tensor=2"
};

// One rank's place on the mesh: rank = ((data * fsdp + fsdp_index) * context + context_index) * tensor + ...
struct MeshCoordinates {
  int64_t data = 0, fsdp = 0, context = 0, tensor = 0;
  int64_t of(MeshAxis axis) const { return axis_member(*this, axis); }
};
MeshCoordinates mesh_coordinates(const Mesh& mesh, int64_t rank);

// Fills a -1 axis from `devices` and checks the product; `devices_source` says where the count came from
// ("topology h100x8", "4 MPI ranks") for the error message.
Mesh resolve_mesh(const MeshShape& requested, int64_t devices, const std::string& devices_source);

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
  ShardingLayout(const Config& config, const Mesh& mesh);

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
