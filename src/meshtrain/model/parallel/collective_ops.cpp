#include "meshtrain/model/parallel/collective_ops.h"

namespace meshtrain {

std::vector<OpDecl> collective_ops(const SpecBuilder& builder, const std::string& name, CollectiveKind kind,
                                   MeshAxis axis, BufferId buffer, BufferId shard, int64_t group) {
  const int64_t ranks = group > 0 ? group : builder.spec().sharding.mesh().size(axis);
  if (ranks == 1) return {};
  OpDecl op{name, {buffer}, {buffer}, 0.0, nullptr, OpKind::collective, {kind, axis, ranks, buffer, shard}};
  if (kind == CollectiveKind::all_gather) op.reads = {shard};
  if (kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_to_all) op.writes = {shard};
  return {op};
}

}  // namespace meshtrain
