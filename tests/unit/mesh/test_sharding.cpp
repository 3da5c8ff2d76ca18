// The sharding rules (mesh/sharding.h): logical axes to mesh axes, compute and storage layouts, the global
// element each shard holds, and rule errors that name their config key.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/mesh/sharding.h"

namespace meshtrain {
namespace {

using testing::error_of;
using Rules = std::map<std::string, std::vector<std::string>>;

// The rules of configs/base.yaml.
Rules base_rules() {
  return {{"batch", {"data", "fsdp"}}, {"length", {"context"}},  {"embed", {"fsdp"}},
          {"heads", {"tensor"}},       {"kv_heads", {"tensor"}}, {"head_dim", {}},
          {"mlp", {"tensor"}},         {"vocab", {"tensor"}},    {"positions", {"fsdp"}}};
}

TEST(Sharding, ComputeLayoutSplitsOnlyOverAxesLargerThanOne) {
  const ShardingLayout layout(base_rules(),
                              Mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 2}, {MeshAxis::tensor, 2}}));
  EXPECT_EQ(layout.compute("batch").degree, 4);
  EXPECT_EQ(layout.compute("heads").degree, 2);
  EXPECT_EQ(layout.compute("embed").degree, 1);   // fsdp on a weight axis is storage only
  EXPECT_EQ(layout.compute("length").degree, 1);  // context = 1
  EXPECT_EQ(layout.compute("rows").degree, 1);    // not a logical axis of the rules
  EXPECT_EQ(layout.local_size("mlp", 64), 32);
  EXPECT_EQ(layout.local_size("kv_heads", 1), 1);  // more tensor ranks than kv heads: one each
}

TEST(Sharding, StorageLayoutAddsFsdpAndUnderZero1Data) {
  const ShardingLayout layout(base_rules(),
                              Mesh({{MeshAxis::data, 2}, {MeshAxis::fsdp, 2}, {MeshAxis::tensor, 2}}));
  const Shape weight{{8, 16}, {"embed", "mlp"}};  // [D, F/tensor]
  const TensorSharding stored = layout.storage_layout(weight, false);
  EXPECT_EQ(stored.local.dims, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(stored.dims[0].axes, (std::vector<MeshAxis>{MeshAxis::fsdp}));
  const TensorSharding zero1 = layout.storage_layout(weight, true);
  EXPECT_EQ(zero1.local.dims, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(zero1.dims[0].axes, (std::vector<MeshAxis>{MeshAxis::fsdp, MeshAxis::data}));
}

TEST(Sharding, GlobalIndexTilesTheTensor) {
  const Mesh mesh({{MeshAxis::fsdp, 2}, {MeshAxis::tensor, 2}});
  const ShardingLayout layout(base_rules(), mesh);
  const TensorSharding stored = layout.storage_layout(Shape{{4, 3}, {"embed", "mlp"}}, false);
  std::vector<int> hits(4 * 6, 0);
  for (int64_t rank = 0; rank < mesh.devices(); ++rank) {
    const GlobalIndex index(stored.local, stored.dims, {4, 6}, mesh, mesh_coordinates(mesh, rank));
    for (int64_t i = 0; i < stored.local.elements(); ++i) ++hits[static_cast<size_t>(index(i))];
  }
  for (int count : hits) EXPECT_EQ(count, 1);
}

TEST(Sharding, RuleErrorsNameTheConfigKey) {
  Rules unknown = base_rules();
  unknown["mlp"] = {"tensr"};
  const std::string typo = error_of([&] { ShardingLayout(unknown, Mesh()); });
  EXPECT_NE(typo.find("config key 'logical_axis_rules.mlp'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("mesh axes among data, stage, fsdp, context, expert, tensor"), std::string::npos)
      << typo;
  EXPECT_NE(typo.find("did you mean 'tensor'?"), std::string::npos) << typo;
  Rules disallowed = base_rules();
  disallowed["heads"] = {"data"};
  const std::string split = error_of([&] { ShardingLayout(disallowed, Mesh()); });
  EXPECT_NE(split.find("config key 'logical_axis_rules.heads'"), std::string::npos) << split;
  EXPECT_NE(split.find("a subset of [tensor]"), std::string::npos) << split;
  // Pipeline stages hold whole layers: no logical axis is split over them.
  Rules over_stages = base_rules();
  over_stages["heads"] = {"stage"};
  const std::string staged = error_of([&] { ShardingLayout(over_stages, Mesh({{MeshAxis::stage, 2}})); });
  EXPECT_NE(staged.find("config key 'logical_axis_rules.heads'"), std::string::npos) << staged;
  EXPECT_NE(staged.find("a subset of [tensor]"), std::string::npos) << staged;
  Rules batch = base_rules();
  batch["batch"] = {"data"};
  const std::string unsplit = error_of([&] { ShardingLayout(batch, Mesh({{MeshAxis::fsdp, 2}})); });
  EXPECT_NE(unsplit.find("config key 'logical_axis_rules.batch'"), std::string::npos) << unsplit;
  const std::string divisible = error_of([] {
    ShardingLayout(base_rules(), Mesh({{MeshAxis::tensor, 2}})).local_size("mlp", 3);
  });
  EXPECT_NE(divisible.find("config key 'base_mlp_dim'"), std::string::npos) << divisible;
}

}  // namespace
}  // namespace meshtrain
