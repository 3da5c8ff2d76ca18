// Cost pass: per op FLOPs, bytes accessed, collective payload (aot-plan.md definitions) and predicted time
// (roofline for compute, each op kind at the rate it runs at; payload / link bandwidth for collectives), and
// the kernel's memory figures.
#include <set>

#include "meshtrain/core/arena.h"
#include "meshtrain/plan/passes.h"

namespace meshtrain {

double collective_payload_bytes(CollectiveKind kind, double full_bytes, double ranks) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2.0 * full_bytes * (ranks - 1.0) / ranks;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
      return full_bytes * (ranks - 1.0) / ranks;
    case CollectiveKind::send_recv:  // bytes sent
      return full_bytes;
    case CollectiveKind::all_to_all:  // bytes leaving the rank: all blocks but its own
      return full_bytes * (ranks - 1.0) / ranks;
  }
  return 0.0;
}

double loss_softmax_logit_passes(const ModelSpec& spec, const PlanOp& op) {
  // The MoE balance loss is a loss op too; it does not read the targets.
  if (op.op->kind != OpKind::loss || !contains(op.op->reads, spec.targets)) return 0.0;
  return op.flops / (2.0 * static_cast<double>(spec.dims.D));
}

namespace {

// Seconds of a compute op's work at the rate its kind runs at on `topology` (shared by `host_share` ranks):
// dense matmuls (and the cross-entropy's two GEMMs) at the matmul rate of the compute dtype, attention at its
// own rate, plus the cross-entropy's softmax part per logit, everything else at the GEMM peak. The bytes it
// moves bound it from below (roofline), at the elementwise ops' own rate for those (norms and activations
// move their bytes slower than a stream).
double compute_op_seconds(const TrainingPlan& plan, const PlanOp& op, double host_share) {
  const Topology& topology = plan.topology;
  const ComputeRates& rates = topology.rates(plan.spec.config.dtype);
  const double logit_passes = loss_softmax_logit_passes(plan.spec, op);  // > 0: the cross-entropy
  const double flops_rate = op.op->kind == OpKind::attention                      ? rates.attention_flops
                            : op.op->kind == OpKind::matmul || logit_passes > 0.0 ? rates.matmul_flops
                                                                                  : rates.peak_flops;
  double seconds = op.flops / (flops_rate / host_share);
  // The cross-entropy's softmax part, beside its GEMMs.
  const double softmax_rate = rates.loss_softmax_logits;
  if (softmax_rate > 0.0) seconds += logit_passes / (softmax_rate / host_share);
  const double bandwidth =
      op.op->kind == OpKind::elementwise ? rates.elementwise_bandwidth : topology.memory_bandwidth;
  return std::max(seconds, op.bytes_accessed / (bandwidth / host_share));
}

}  // namespace

void cost_kernel(const TrainingPlan& plan, KernelPlan& kernel) {
  const ModelSpec& spec = plan.spec;
  const Topology& topology = plan.topology;
  // Ranks sharing a cpu host share its peaks too.
  const double host_share = topology.host_memory_shared ? static_cast<double>(plan.mesh.devices()) : 1.0;
  for (PlanOp& op : kernel.ops) {
    op.flops = op.op->flops;
    op.bytes_accessed = 0.0;
    double spec_elements = 0.0, bound_elements = 0.0;
    for (const auto& [spec_id, plan_id] : op.buffers) {
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(plan_id)];
      const double touched =
          (contains(op.op->reads, spec_id) ? 1.0 : 0.0) + (contains(op.op->writes, spec_id) ? 1.0 : 0.0);
      op.bytes_accessed += touched * static_cast<double>(buffer.bytes);
      if (spec_id == plan_id) continue;
      spec_elements += static_cast<double>(spec.buffer(spec_id).shape.elements());
      bound_elements += static_cast<double>(buffer.shape.elements());
    }
    // An op bound to shards does the shard's share of its work.
    if (spec_elements > 0.0) op.flops *= bound_elements / spec_elements;
    if (op.op->kind == OpKind::collective) {
      const CollectiveDecl& c = op.op->collective;
      // A send_recv that only receives sends nothing.
      const double full_bytes = c.buffer == kNoBuffer
                                    ? 0.0
                                    : static_cast<double>(plan.buffers[static_cast<size_t>(c.buffer)].bytes);
      op.collective_bytes = collective_payload_bytes(c.kind, full_bytes, static_cast<double>(c.group)) *
                            static_cast<double>(c.repeats);
      op.seconds = op.collective_bytes / topology.link_bandwidth(c.group, plan.mesh.stride(c.axis));
      kernel.collective_bytes[mesh_axis_name(c.axis)] += op.collective_bytes;
    } else {
      op.seconds = compute_op_seconds(plan, op, host_share);
    }
    kernel.flops += op.flops;
    kernel.bytes_accessed += op.bytes_accessed;
    kernel.seconds += op.seconds;
  }
}

MemoryFigures memory_figures(const TrainingPlan& plan, const KernelPlan& kernel, size_t temps) {
  // The arguments: every persistent buffer the kernel touches (a shard viewed inside one counts as it).
  std::set<PlanBufferId> arguments;
  for (const PlanOp& op : kernel.ops) {
    for (size_t b = 0; b < op.buffers.size(); ++b) {
      const auto& binding = op.buffers[b];
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(binding.second)];
      // A batch input the split kernels read from their activation slot counts among their temporaries.
      if (plan.stash.in_slot_zero(op.offsets[b])) continue;
      if (buffer.persistent || buffer.part_of >= 0)
        arguments.insert(buffer.part_of >= 0 ? buffer.part_of : binding.second);
    }
  }
  // Outputs are the arguments a kernel updates (aliases) plus its scalar results.
  MemoryFigures memory;
  for (PlanBufferId id : arguments) {
    const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
    memory.arguments += align_up(buffer.bytes);
    const bool updated = kernel.kernel == KernelName::update
                             ? buffer.kind != BufferKind::input && buffer.kind != BufferKind::gradient
                         : kernel.kernel == KernelName::decode
                             ? buffer.kind == BufferKind::cache
                             : kernel.kernel != KernelName::eval && buffer.kind == BufferKind::gradient;
    if (updated) memory.aliases += align_up(buffer.bytes);
  }
  const size_t scalar_results = 16;  // loss sum and valid count, or the two norms
  memory.outputs = memory.aliases + scalar_results;
  memory.temps = temps;
  memory.peak = memory.arguments + memory.outputs + memory.temps - memory.aliases;
  return memory;
}

}  // namespace meshtrain
