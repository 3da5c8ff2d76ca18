#include "meshtrain/plan/arena_plan.h"

#include "meshtrain/core/arena.h"

namespace meshtrain {

ArenaPlan plan_arena(const ModelSpec& spec) {
  ArenaPlan plan;
  plan.offsets.reserve(spec.buffers.size());
  for (const BufferDecl& buffer : spec.buffers) {
    plan.offsets.push_back(plan.total_bytes);
    plan.total_bytes += align_up(static_cast<size_t>(buffer.shape.elements()) * dtype_bytes(buffer.dtype));
  }
  return plan;
}

size_t ArenaPlan::bytes_by_kind(const ModelSpec& spec, BufferKind kind) const {
  size_t bytes = 0;
  for (const BufferDecl& buffer : spec.buffers) {
    if (buffer.kind == kind)
      bytes += align_up(static_cast<size_t>(buffer.shape.elements()) * dtype_bytes(buffer.dtype));
  }
  return bytes;
}

}  // namespace meshtrain
