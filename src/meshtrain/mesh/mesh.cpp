// The rank order of the mesh and the groups of ranks along its axes (mesh.h).
#include "meshtrain/mesh/mesh.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain {

Mesh::Mesh(std::initializer_list<std::pair<MeshAxis, int64_t>> sizes) {
  for (const auto& [axis, size] : sizes) {
    MT_CHECK(size >= 1,
             std::string("mesh axis ") + mesh_axis_name(axis) + " of size " + std::to_string(size));
    sizes_[mesh_axis_index(axis)] = size;
  }
}

int64_t Mesh::devices() const {
  int64_t devices = 1;
  for (int64_t size : sizes_) devices *= size;
  return devices;
}

int64_t Mesh::stride(MeshAxis axis) const {
  int64_t stride = 1;
  for (auto inner = kMeshAxes.rbegin(); *inner != axis; ++inner) stride *= size(*inner);
  return stride;
}

std::vector<MeshAxis> listed_mesh_axes(const Mesh& mesh) {
  std::vector<MeshAxis> axes;
  for (MeshAxis axis : kMeshAxes) {
    if (axis != MeshAxis::stage || mesh.size(axis) != 1) axes.push_back(axis);
  }
  return axes;
}

std::string Mesh::to_string() const {
  std::string text;
  for (MeshAxis axis : listed_mesh_axes(*this))
    text += (text.empty() ? "" : " ") + std::string(mesh_axis_name(axis)) + "=" + std::to_string(size(axis));
  return text;
}

MeshCoordinates mesh_coordinates(const Mesh& mesh, int64_t rank) {
  MeshCoordinates coordinates;
  for (MeshAxis axis : kMeshAxes) coordinates[axis] = rank / mesh.stride(axis) % mesh.size(axis);
  return coordinates;
}

int64_t mesh_rank(const Mesh& mesh, const MeshCoordinates& coordinates) {
  int64_t rank = 0;
  for (MeshAxis axis : kMeshAxes) rank = rank * mesh.size(axis) + coordinates[axis];
  return rank;
}

MeshGroup mesh_group(const Mesh& mesh, int64_t rank, std::span<const MeshAxis> axes) {
  const MeshCoordinates coordinates = mesh_coordinates(mesh, rank);
  MeshGroup group;
  // Both are indices in rank order: the colour over the axes outside the group, the index over those in it.
  for (MeshAxis axis : kMeshAxes) {
    const bool in_group = std::find(axes.begin(), axes.end(), axis) != axes.end();
    int64_t& place = in_group ? group.index : group.colour;
    place = place * mesh.size(axis) + coordinates[axis];
    if (in_group) group.size *= mesh.size(axis);
  }
  return group;
}

Mesh resolve_mesh(const MeshShape& requested, int64_t devices, const std::string& devices_source) {
  Mesh mesh;
  mesh.sizes_ = requested.sizes;
  int64_t* fill = nullptr;
  int64_t product = 1;
  for (MeshAxis axis : kMeshAxes) {
    int64_t* value = &mesh.sizes_[mesh_axis_index(axis)];
    const std::string key = std::string("mesh.") + mesh_axis_name(axis);
    if (*value == -1) {
      if (fill)
        fail("config key '" + key + "'", "at most one mesh axis set to -1", "two", "give all but one");
      fill = value;
    } else if (*value < 1) {
      fail("config key '" + key + "'", "a positive axis size, or -1 to fill in", std::to_string(*value));
    } else {
      product *= *value;
    }
  }
  if (fill) {
    if (devices % product != 0) {
      fail("config key 'mesh'",
           "axes whose product divides the " + std::to_string(devices) + " devices of " + devices_source,
           mesh.to_string() + " (product of the fixed axes " + std::to_string(product) + ")",
           "change the fixed mesh.* axes so that their product divides " + std::to_string(devices));
    }
    *fill = devices / product;
    product = devices;
  }
  if (product != devices) {
    fail("config key 'mesh'",
         "a product of " + std::to_string(devices) + " (the devices of " + devices_source + ")",
         mesh.to_string() + " (product " + std::to_string(product) + ")",
         "change one mesh.* axis, or set one of them to -1 to fill it in");
  }
  return mesh;
}

}  // namespace meshtrain
