// The one constructor of collective ops in the spec: the parallel building blocks (model/parallel/) declare
// every collective a layer needs through it, as data the plan sizes and the engine runs. Layers call the
// blocks, never this.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// A collective over `axis` of `buffer` (full-size side) as an op; nothing when the axis has one rank.
// `shard` is the other side of a gather or scatter (or the all-to-all's receive buffer); `group` the ranks
// when not the whole axis (0: the axis's size).
std::vector<OpDecl> collective_ops(const SpecBuilder& builder, const std::string& name, CollectiveKind kind,
                                   MeshAxis axis, BufferId buffer, BufferId shard = kNoBuffer,
                                   int64_t group = 0);

}  // namespace meshtrain
