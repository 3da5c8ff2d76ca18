// The sharding pass: logical-axis rules to mesh axes, compute and storage layouts (sharding.h).
#include "meshtrain/mesh/sharding.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Which mesh axes the engine's layers can split each logical axis over in the compute layout. `fsdp`
// on a weight axis is a storage choice (gathered before use), so it is allowed there too.
const std::map<std::string, std::vector<MeshAxis>>& allowed_axes() {
  static const std::map<std::string, std::vector<MeshAxis>> allowed = {
      {"batch", {kBatchMeshAxes.begin(), kBatchMeshAxes.end()}},
      {"length", {MeshAxis::context}},
      {"embed", {MeshAxis::fsdp}},
      {"heads", {MeshAxis::tensor}},
      {"kv_heads", {MeshAxis::tensor}},
      {"head_dim", {MeshAxis::fsdp}},
      {"mlp", {MeshAxis::tensor}},
      {"vocab", {MeshAxis::tensor}},
      {"positions", {MeshAxis::fsdp}},
      {"experts", {MeshAxis::expert}},
      {"engram_rows", {MeshAxis::tensor}},  // Engram's tables, split like the vocabulary
  };
  return allowed;
}

MeshAxis parse_mesh_axis(const std::string& logical_axis, const std::string& name) {
  for (MeshAxis axis : kMeshAxes) {
    if (name == mesh_axis_name(axis)) return axis;
  }
  const std::vector<std::string> names(kMeshAxisNames.begin(), kMeshAxisNames.end());
  std::string listed;
  for (const std::string& axis_name : names) listed += (listed.empty() ? "" : ", ") + axis_name;
  fail("config key 'logical_axis_rules." + logical_axis + "'", "mesh axes among " + listed, "'" + name + "'",
       "did you mean '" + closest_name(name, names) + "'?");
}

std::string axes_text(const std::vector<MeshAxis>& axes) {
  std::string text;
  for (MeshAxis axis : axes) text += (text.empty() ? "" : ", ") + std::string(mesh_axis_name(axis));
  return "[" + text + "]";
}

}  // namespace

GlobalIndex::GlobalIndex(const Shape& local, const std::vector<DimSharding>& sharding,
                         const std::vector<int64_t>& global_dims, const Mesh& mesh,
                         const MeshCoordinates& coordinates)
    : local_dims_(local.dims), offsets_(local.dims.size(), 0), global_strides_(local.dims.size(), 1) {
  MT_CHECK(sharding.size() == local.dims.size() && global_dims.size() == local.dims.size(), "rank mismatch");
  for (size_t i = local.dims.size(); i-- > 0;) {
    if (i + 1 < local.dims.size()) global_strides_[i] = global_strides_[i + 1] * global_dims[i + 1];
    int64_t shard = 0;
    for (MeshAxis axis : sharding[i].axes) shard = shard * mesh.size(axis) + coordinates[axis];
    const int64_t shards = global_dims[i] / local.dims[i];  // < degree when replicated in groups
    MT_CHECK(shards >= 1 && sharding[i].degree % shards == 0, "global size does not fit the sharding");
    offsets_[i] = shard / (sharding[i].degree / shards) * local.dims[i];
  }
}

int64_t GlobalIndex::operator()(int64_t local_flat) const {
  int64_t global = 0;
  for (size_t i = local_dims_.size(); i-- > 0;) {
    global += (offsets_[i] + local_flat % local_dims_[i]) * global_strides_[i];
    local_flat /= local_dims_[i];
  }
  return global;
}

ShardingLayout::ShardingLayout(const std::map<std::string, std::vector<std::string>>& rules, const Mesh& mesh)
    : mesh_(mesh) {
  for (const auto& [logical_axis, allowed] : allowed_axes()) {
    const auto rule = rules.find(logical_axis);
    std::vector<MeshAxis> axes;
    if (rule != rules.end()) {
      for (const std::string& name : rule->second) {
        const MeshAxis axis = parse_mesh_axis(logical_axis, name);
        if (std::find(allowed.begin(), allowed.end(), axis) == allowed.end()) {
          fail("config key 'logical_axis_rules." + logical_axis + "'", "a subset of " + axes_text(allowed),
               "'" + name + "'",
               "the engine's layers split '" + logical_axis + "' only over those mesh axes");
        }
        axes.push_back(axis);
      }
    }
    rules_[logical_axis] = axes;
    DimSharding compute;
    for (MeshAxis axis : axes) {
      if (axis == MeshAxis::fsdp && logical_axis != "batch") continue;  // storage only
      if (mesh.size(axis) == 1) continue;
      compute.axes.push_back(axis);
      compute.degree *= mesh.size(axis);
    }
    compute_[logical_axis] = compute;
  }
  // The batch of every micro-batch is split over data x fsdp x expert whatever the rules say about it: FSDP
  // or expert parallelism without a split batch would repeat work, and the global batch rule
  // (per_device_batch_size x devices) needs it.
  const DimSharding& batch = compute_["batch"];
  int64_t batch_ranks = 1;
  for (MeshAxis axis : kBatchMeshAxes) batch_ranks *= mesh.size(axis);
  if (batch.degree != batch_ranks) {
    fail("config key 'logical_axis_rules.batch'",
         axes_text({kBatchMeshAxes.begin(), kBatchMeshAxes.end()}) + " (the batch is split over all of them)",
         axes_text(batch.axes));
  }
}

const DimSharding& ShardingLayout::compute(const std::string& logical_axis) const {
  static const DimSharding unsharded;
  const auto found = compute_.find(logical_axis);
  return found == compute_.end() ? unsharded : found->second;
}

int64_t ShardingLayout::local_size(const std::string& logical_axis, int64_t global_size) const {
  const DimSharding& sharding = compute(logical_axis);
  if (global_size % sharding.degree == 0) return global_size / sharding.degree;
  // More tensor ranks than kv heads: each rank keeps the one kv head its query heads use (as Megatron).
  if (logical_axis == "kv_heads" && sharding.degree % global_size == 0) return 1;
  std::string key = "logical_axis_rules." + logical_axis;
  if (logical_axis == "heads") key = "base_num_query_heads";
  if (logical_axis == "kv_heads") key = "base_num_kv_heads";
  if (logical_axis == "mlp") key = "base_mlp_dim";
  if (logical_axis == "batch") key = "per_device_batch_size";
  if (logical_axis == "length") key = "max_target_length";
  std::string over;
  for (MeshAxis axis : sharding.axes) over += (over.empty() ? "" : " x ") + std::string(mesh_axis_name(axis));
  fail("config key '" + key + "'",
       "a size divisible by the " + over + " degree " + std::to_string(sharding.degree) +
           (logical_axis == "kv_heads" ? " (or a tensor degree that is a multiple of it)" : ""),
       std::to_string(global_size), "change the mesh (" + mesh_.to_string() + ") or the model shape");
}

TensorSharding ShardingLayout::compute_layout(const Shape& local_shape) const {
  TensorSharding layout{{}, local_shape};
  for (const std::string& axis : local_shape.axes) layout.dims.push_back(compute(axis));
  return layout;
}

TensorSharding ShardingLayout::storage_layout(const Shape& local_shape, bool over_data) const {
  TensorSharding layout = compute_layout(local_shape);
  const size_t rank = local_shape.dims.size();
  const auto tensor_sharded = [&](size_t i) {
    const std::vector<MeshAxis>& axes = layout.dims[i].axes;
    return std::find(axes.begin(), axes.end(), MeshAxis::tensor) != axes.end();
  };
  const auto ruled = [&](size_t i, MeshAxis axis) {
    const auto rule = rules_.find(local_shape.axes[i]);
    return rule != rules_.end() &&
           std::find(rule->second.begin(), rule->second.end(), axis) != rule->second.end();
  };
  const auto place = [&](MeshAxis axis, bool prefer_rules) {
    const int64_t degree = mesh_.size(axis);
    if (degree == 1) return;
    for (int pass = prefer_rules ? 0 : 1; pass < 2; ++pass) {
      for (size_t i = 0; i < rank; ++i) {
        // A stacked parameter's layer axis is never split: each layer's block stays whole on every rank.
        if (tensor_sharded(i) || local_shape.axes[i] == "layers" || layout.local.dims[i] % degree != 0 ||
            (pass == 0 && !ruled(i, axis)))
          continue;
        layout.dims[i].axes.push_back(axis);
        layout.dims[i].degree *= degree;
        layout.local.dims[i] /= degree;
        return;
      }
    }
  };
  place(MeshAxis::fsdp, true);
  if (over_data) place(MeshAxis::data, false);
  return layout;
}

}  // namespace meshtrain
