// The mesh (mesh/mesh.h): rank order and coordinates, the groups collectives run over, and resolving the
// mesh a config asks for against a device count.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/mesh/mesh.h"

namespace meshtrain {
namespace {

using testing::error_of;

std::vector<Mesh> meshes() {
  return {Mesh(),
          Mesh({{MeshAxis::data, 2}}),
          Mesh({{MeshAxis::tensor, 4}}),
          Mesh({{MeshAxis::data, 2}, {MeshAxis::tensor, 2}}),
          Mesh({{MeshAxis::data, 3}, {MeshAxis::fsdp, 2}, {MeshAxis::context, 1}, {MeshAxis::tensor, 2}}),
          Mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 3}, {MeshAxis::context, 2}, {MeshAxis::tensor, 5}}),
          Mesh({{MeshAxis::data, 2}, {MeshAxis::stage, 3}, {MeshAxis::fsdp, 2}, {MeshAxis::tensor, 2}})};
}

TEST(Mesh, AxesAreInRankOrderWithTensorInnermost) {
  ASSERT_EQ(kMeshAxes.size(), kMeshAxisNames.size());
  for (size_t i = 0; i < kMeshAxes.size(); ++i) EXPECT_EQ(mesh_axis_index(kMeshAxes[i]), i);
  EXPECT_EQ(kMeshAxes.front(), MeshAxis::data);
  EXPECT_EQ(kMeshAxes.back(), MeshAxis::tensor);
  EXPECT_STREQ(mesh_axis_name(MeshAxis::context), "context");
  // MaxText's order: data, stage, fsdp, context, expert, tensor.
  EXPECT_STREQ(mesh_axis_name(MeshAxis::stage), "stage");
  EXPECT_EQ(mesh_axis_index(MeshAxis::stage), mesh_axis_index(MeshAxis::data) + 1);
  EXPECT_EQ(mesh_axis_index(MeshAxis::fsdp), mesh_axis_index(MeshAxis::stage) + 1);
  EXPECT_STREQ(mesh_axis_name(MeshAxis::expert), "expert");
  EXPECT_EQ(mesh_axis_index(MeshAxis::expert), mesh_axis_index(MeshAxis::context) + 1);
  EXPECT_EQ(mesh_axis_index(MeshAxis::tensor), mesh_axis_index(MeshAxis::expert) + 1);
  const Mesh mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 3}, {MeshAxis::context, 4}, {MeshAxis::tensor, 5}});
  EXPECT_EQ(mesh.devices(), 120);
  EXPECT_EQ(mesh.stride(MeshAxis::tensor), 1);
  EXPECT_EQ(mesh.stride(MeshAxis::context), 5);
  EXPECT_EQ(mesh.stride(MeshAxis::fsdp), 20);
  EXPECT_EQ(mesh.stride(MeshAxis::data), 60);
  EXPECT_EQ(mesh.to_string(), "data=2 fsdp=3 context=4 expert=1 tensor=5");
  const Mesh with_experts({{MeshAxis::context, 4}, {MeshAxis::expert, 2}, {MeshAxis::tensor, 5}});
  EXPECT_EQ(with_experts.stride(MeshAxis::expert), 5);
  EXPECT_EQ(with_experts.stride(MeshAxis::context), 10);
  EXPECT_EQ(with_experts.to_string(), "data=1 fsdp=1 context=4 expert=2 tensor=5");
  EXPECT_EQ(Mesh().to_string(), "data=1 fsdp=1 context=1 expert=1 tensor=1");
}

// A stage axis of size 1 changes no rank, no group and no printed mesh: every rank's coordinates on the other
// axes and every group's colour and index are those of the same mesh without the axis (the rank formula of
// before it existed), and to_string leaves it out; a larger one is printed in its rank-order place.
TEST(Mesh, StageOfOneChangesNoRankGroupOrText) {
  const Mesh mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 3}, {MeshAxis::context, 2}, {MeshAxis::tensor, 2}});
  EXPECT_EQ(mesh.stride(MeshAxis::data), 12);
  for (int64_t rank = 0; rank < mesh.devices(); ++rank) {
    // The rank formula before the stage axis: rank = ((data x 3 + fsdp) x 2 + context) x 2 + tensor.
    const int64_t tensor = rank % 2, context = rank / 2 % 2, fsdp = rank / 4 % 3, data = rank / 12;
    const MeshCoordinates coordinates = mesh_coordinates(mesh, rank);
    EXPECT_EQ(coordinates[MeshAxis::stage], 0);
    EXPECT_EQ(coordinates[MeshAxis::data], data);
    EXPECT_EQ(coordinates[MeshAxis::fsdp], fsdp);
    EXPECT_EQ(coordinates[MeshAxis::context], context);
    EXPECT_EQ(coordinates[MeshAxis::tensor], tensor);
    const MeshGroup batch = mesh_group(mesh, rank, kBatchMeshAxes);
    EXPECT_EQ(batch.index, data * 3 + fsdp);
    EXPECT_EQ(batch.colour, context * 2 + tensor);
    const MeshGroup stage = mesh_group(mesh, rank, MeshAxis::stage);
    EXPECT_EQ(stage.size, 1);
    EXPECT_EQ(stage.index, 0);
    EXPECT_EQ(stage.colour, rank);
  }
  EXPECT_EQ(listed_mesh_axes(mesh), (std::vector<MeshAxis>{MeshAxis::data, MeshAxis::fsdp, MeshAxis::context,
                                                           MeshAxis::expert, MeshAxis::tensor}));
  const Mesh staged({{MeshAxis::data, 2}, {MeshAxis::stage, 4}, {MeshAxis::tensor, 2}});
  EXPECT_EQ(staged.to_string(), "data=2 stage=4 fsdp=1 context=1 expert=1 tensor=2");
  EXPECT_EQ(staged.stride(MeshAxis::stage), 2);
  EXPECT_EQ(staged.stride(MeshAxis::data), 8);
  EXPECT_EQ(mesh_group(staged, 5, MeshAxis::stage).index, 2);
  EXPECT_EQ(listed_mesh_axes(staged), (std::vector<MeshAxis>(kMeshAxes.begin(), kMeshAxes.end())));
}

TEST(Mesh, RanksAndCoordinatesRoundTrip) {
  for (const Mesh& mesh : meshes()) {
    std::set<std::vector<int64_t>> seen;
    for (int64_t rank = 0; rank < mesh.devices(); ++rank) {
      const MeshCoordinates coordinates = mesh_coordinates(mesh, rank);
      std::vector<int64_t> place;
      for (MeshAxis axis : kMeshAxes) {
        EXPECT_GE(coordinates[axis], 0);
        EXPECT_LT(coordinates[axis], mesh.size(axis));
        place.push_back(coordinates[axis]);
      }
      EXPECT_EQ(mesh_rank(mesh, coordinates), rank) << mesh.to_string();
      seen.insert(place);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), mesh.devices()) << mesh.to_string();
  }
  // Tensor neighbours are adjacent ranks; the data coordinate is the outermost.
  const Mesh mesh({{MeshAxis::data, 2}, {MeshAxis::tensor, 4}});
  EXPECT_EQ(mesh_coordinates(mesh, 5)[MeshAxis::data], 1);
  EXPECT_EQ(mesh_coordinates(mesh, 5)[MeshAxis::tensor], 1);
}

// Every group over `axes`: its members differ only along those axes, each member's index is distinct and
// follows rank order, and the groups tile the mesh.
void check_groups(const Mesh& mesh, const std::vector<MeshAxis>& axes) {
  std::map<int64_t, std::vector<int64_t>> members;  // colour -> ranks, in rank order
  int64_t size = 1;
  for (MeshAxis axis : axes) size *= mesh.size(axis);
  for (int64_t rank = 0; rank < mesh.devices(); ++rank) {
    const MeshGroup group = mesh_group(mesh, rank, axes);
    EXPECT_EQ(group.size, size);
    EXPECT_EQ(group.index, static_cast<int64_t>(members[group.colour].size())) << "index in rank order";
    members[group.colour].push_back(rank);
  }
  EXPECT_EQ(static_cast<int64_t>(members.size()), mesh.devices() / size) << mesh.to_string();
  for (const auto& [colour, ranks] : members) {
    EXPECT_EQ(static_cast<int64_t>(ranks.size()), size);
    const MeshCoordinates first = mesh_coordinates(mesh, ranks.front());
    for (int64_t rank : ranks) {
      const MeshCoordinates coordinates = mesh_coordinates(mesh, rank);
      for (MeshAxis axis : kMeshAxes) {
        const bool in_group = std::find(axes.begin(), axes.end(), axis) != axes.end();
        if (!in_group) {
          EXPECT_EQ(coordinates[axis], first[axis]) << mesh.to_string() << " rank " << rank;
        }
      }
    }
  }
}

TEST(Mesh, GroupsDifferOnlyAlongTheirAxes) {
  for (const Mesh& mesh : meshes()) {
    for (MeshAxis axis : kMeshAxes) check_groups(mesh, {axis});
    check_groups(mesh, {kBatchMeshAxes.begin(), kBatchMeshAxes.end()});
    check_groups(mesh, {});
    check_groups(mesh, {kMeshAxes.begin(), kMeshAxes.end()});
  }
}

TEST(Mesh, OneAxisGroupIndexIsTheCoordinate) {
  const Mesh mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 3}, {MeshAxis::context, 2}, {MeshAxis::tensor, 2}});
  for (int64_t rank = 0; rank < mesh.devices(); ++rank) {
    for (MeshAxis axis : kMeshAxes) {
      const MeshGroup group = mesh_group(mesh, rank, axis);
      EXPECT_EQ(group.index, mesh_coordinates(mesh, rank)[axis]);
      EXPECT_EQ(group.size, mesh.size(axis));
    }
  }
  // The batch group: data x fsdp, so with tensor = 2 ranks 0 and 1 see different places of one batch.
  const Mesh data_tensor({{MeshAxis::data, 2}, {MeshAxis::tensor, 2}});
  EXPECT_EQ(mesh_group(data_tensor, 2, kBatchMeshAxes).index, 1);
  EXPECT_EQ(mesh_group(data_tensor, 2, kBatchMeshAxes).colour, 0);
  EXPECT_EQ(mesh_group(data_tensor, 1, kBatchMeshAxes).colour, 1);
}

TEST(Mesh, AxisOfSizeBelowOneIsABug) {
  EXPECT_THROW(Mesh({{MeshAxis::fsdp, 0}}), std::logic_error);
}

MeshShape shape(std::initializer_list<std::pair<MeshAxis, int64_t>> sizes) {
  MeshShape requested;
  for (const auto& [axis, size] : sizes) requested[axis] = size;
  return requested;
}

TEST(Mesh, ResolveFillsOneAxisFromTheDevices) {
  const Mesh mesh = resolve_mesh(shape({{MeshAxis::data, -1}, {MeshAxis::tensor, 2}}), 8, "topology h100x8");
  EXPECT_EQ(mesh.size(MeshAxis::data), 4);
  EXPECT_EQ(mesh.size(MeshAxis::tensor), 2);
  EXPECT_EQ(mesh.devices(), 8);
  EXPECT_EQ(resolve_mesh(MeshShape(), 1, "1 process").to_string(), Mesh().to_string());
}

TEST(Mesh, ResolveErrorsNameTheKey) {
  const std::string product = error_of([] {
    resolve_mesh(shape({{MeshAxis::data, 3}}), 8, "topology h100x8");
  });
  EXPECT_NE(product.find("config key 'mesh'"), std::string::npos) << product;
  EXPECT_NE(product.find("product of 8 (the devices of topology h100x8)"), std::string::npos) << product;
  EXPECT_NE(product.find("data=3 fsdp=1 context=1 expert=1 tensor=1"), std::string::npos) << product;
  const std::string two = error_of([] {
    resolve_mesh(shape({{MeshAxis::data, -1}, {MeshAxis::fsdp, -1}}), 8, "topology h100x8");
  });
  EXPECT_NE(two.find("config key 'mesh.fsdp'"), std::string::npos) << two;
  EXPECT_NE(two.find("at most one mesh axis set to -1"), std::string::npos) << two;
  const std::string zero = error_of([] {
    resolve_mesh(shape({{MeshAxis::context, 0}}), 8, "topology h100x8");
  });
  EXPECT_NE(zero.find("config key 'mesh.context'"), std::string::npos) << zero;
  const std::string fill = error_of([] {
    resolve_mesh(shape({{MeshAxis::data, -1}, {MeshAxis::tensor, 3}}), 8, "topology h100x8");
  });
  EXPECT_NE(fill.find("divides the 8 devices"), std::string::npos) << fill;
  // A stage degree that does not divide the devices: the mesh named with its stage axis, and the fix.
  const std::string stage = error_of([] { resolve_mesh(shape({{MeshAxis::stage, 3}}), 4, "4 processes"); });
  EXPECT_NE(stage.find("config key 'mesh'"), std::string::npos) << stage;
  EXPECT_NE(stage.find("a product of 4 (the devices of 4 processes)"), std::string::npos) << stage;
  EXPECT_NE(stage.find("data=1 stage=3 fsdp=1 context=1 expert=1 tensor=1 (product 3)"), std::string::npos)
      << stage;
  EXPECT_NE(stage.find("change one mesh.* axis"), std::string::npos) << stage;
  const std::string stage_fill = error_of([] {
    resolve_mesh(shape({{MeshAxis::data, -1}, {MeshAxis::stage, 3}}), 4, "4 processes");
  });
  EXPECT_NE(stage_fill.find("divides the 4 devices of 4 processes, found data=-1 stage=3"), std::string::npos)
      << stage_fill;
  const std::string stage_zero = error_of([] {
    resolve_mesh(shape({{MeshAxis::stage, 0}}), 4, "4 processes");
  });
  EXPECT_NE(stage_zero.find("config key 'mesh.stage'"), std::string::npos) << stage_zero;
  EXPECT_NE(stage_zero.find("a positive axis size, or -1 to fill in"), std::string::npos) << stage_zero;
  EXPECT_EQ(resolve_mesh(shape({{MeshAxis::stage, -1}, {MeshAxis::data, 2}}), 8, "8 processes")
                .size(MeshAxis::stage),
            4);
}

}  // namespace
}  // namespace meshtrain
