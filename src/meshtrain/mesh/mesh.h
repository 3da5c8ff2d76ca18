// The device mesh, written once: its axes in rank order, a rank's coordinates on it, and the groups of
// ranks that collectives run over (one per axis, or over several axes, such as the batch's data x fsdp).
// Everything else (config, comm, model, plan, train) asks this file instead of computing a rank formula.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

// The mesh axes in rank order, outermost first: tensor is innermost, so its ranks are neighbours. The
// enum's values index every per-axis array. A new axis is one value here and its name in kMeshAxisNames
// (plus, being a config key, `mesh.<axis>: 1` in configs/base.yaml and its line in docs/configuration.md).
// `stage` (pipeline stages, shared/specs/pipeline.md; MaxText's order: data outermost, then stage) holds
// contiguous layer chunks: no buffer is sharded over it and it is neither a batch nor a token axis.
// `expert` (the reference system's expert parallelism: the routed experts split over it, and the batch as
// over data) sits between context and tensor.
enum class MeshAxis { data, stage, fsdp, context, expert, tensor };
inline constexpr std::array kMeshAxisNames = {"data", "stage", "fsdp", "context", "expert", "tensor"};
static_assert(static_cast<size_t>(MeshAxis::tensor) + 1 == kMeshAxisNames.size(),
              "one name per mesh axis, and tensor stays innermost");

inline constexpr size_t kMeshAxisCount = kMeshAxisNames.size();
inline constexpr std::array<MeshAxis, kMeshAxisCount> kMeshAxes = [] {
  std::array<MeshAxis, kMeshAxisCount> axes{};
  for (size_t i = 0; i < kMeshAxisCount; ++i) axes[i] = static_cast<MeshAxis>(i);
  return axes;
}();

inline constexpr size_t mesh_axis_index(MeshAxis axis) {
  return static_cast<size_t>(axis);
}
inline const char* mesh_axis_name(MeshAxis axis) {
  return kMeshAxisNames[mesh_axis_index(axis)];
}

// One value per mesh axis, indexed by the axis.
using PerMeshAxis = std::array<int64_t, kMeshAxisCount>;
constexpr PerMeshAxis per_mesh_axis(int64_t value) {
  PerMeshAxis values{};
  values.fill(value);
  return values;
}

// The mesh a config asks for (config keys mesh.*): -1 on an axis means "fill in from the device count".
struct MeshShape {
  PerMeshAxis sizes = per_mesh_axis(1);

  int64_t& operator[](MeshAxis axis) { return sizes[mesh_axis_index(axis)]; }
  int64_t operator[](MeshAxis axis) const { return sizes[mesh_axis_index(axis)]; }
};

// A resolved mesh: every axis >= 1, product = devices.
class Mesh {
 public:
  Mesh() = default;  // one device
  // The axes not named are 1: Mesh({{MeshAxis::data, 2}, {MeshAxis::tensor, 4}}).
  explicit Mesh(std::initializer_list<std::pair<MeshAxis, int64_t>> sizes);

  int64_t size(MeshAxis axis) const { return sizes_[mesh_axis_index(axis)]; }
  int64_t devices() const;
  // Distance in rank between neighbours of a group along `axis` (tensor: 1).
  int64_t stride(MeshAxis axis) const;
  std::string to_string() const;  // "data=2 fsdp=1 context=1 expert=1 tensor=2" (listed_mesh_axes)

 private:
  friend Mesh resolve_mesh(const MeshShape& requested, int64_t devices, const std::string& devices_source);
  PerMeshAxis sizes_ = per_mesh_axis(1);
};

// The axes a mesh is printed and identified by (Mesh::to_string, plan identities), in rank order: every
// axis but a stage axis of size 1, so that a mesh without pipeline stages prints, and a plan of it hashes,
// exactly as before the stage axis existed (plan files and messages of such runs stay valid).
std::vector<MeshAxis> listed_mesh_axes(const Mesh& mesh);

// One rank's place on the mesh: rank = sum over axes of coordinate x stride.
struct MeshCoordinates {
  PerMeshAxis positions = per_mesh_axis(0);

  int64_t& operator[](MeshAxis axis) { return positions[mesh_axis_index(axis)]; }
  int64_t operator[](MeshAxis axis) const { return positions[mesh_axis_index(axis)]; }
};
MeshCoordinates mesh_coordinates(const Mesh& mesh, int64_t rank);
int64_t mesh_rank(const Mesh& mesh, const MeshCoordinates& coordinates);  // the inverse

// The group of ranks that differ from one rank only along `axes` (every other coordinate fixed).
// `colour` names the group (the rank's index on the mesh with those axes left out) and `index` is the
// rank's place inside it (rank order): the colour and key of MPI_Comm_split. `size` is the group's size.
struct MeshGroup {
  int64_t colour = 0, index = 0, size = 1;
};
MeshGroup mesh_group(const Mesh& mesh, int64_t rank, std::span<const MeshAxis> axes);
inline MeshGroup mesh_group(const Mesh& mesh, int64_t rank, MeshAxis axis) {
  return mesh_group(mesh, rank, std::span<const MeshAxis>(&axis, 1));
}

// The mesh axes the batch of every micro-batch is split over: ranks in one batch group see different rows.
// Expert ranks too (as the reference system's expert axis): outside the routed experts they work like data
// ranks, and the experts see every expert rank's tokens through the all-to-all dispatch.
inline constexpr std::array kBatchMeshAxes = {MeshAxis::data, MeshAxis::fsdp, MeshAxis::expert};
// The mesh axes whose ranks hold different tokens of a micro-batch: the batch axes (different rows) and
// context (different tokens of the same rows), in rank order. Sums over tokens (the loss, the valid count,
// the experts' loads) and gradients of what these ranks share add up over them.
inline constexpr std::array kTokenMeshAxes = {MeshAxis::data, MeshAxis::fsdp, MeshAxis::context,
                                              MeshAxis::expert};

// Fills a -1 axis from `devices` and checks the product; `devices_source` says where the count came from
// ("topology h100x8", "4 MPI ranks") for the error message.
Mesh resolve_mesh(const MeshShape& requested, int64_t devices, const std::string& devices_source);

}  // namespace meshtrain
