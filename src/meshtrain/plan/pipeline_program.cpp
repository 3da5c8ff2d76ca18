// A stage rank's program from its pipeline schedule: F, B (or zero_bubble's B_input and W) as the split
// kernels, sends and receives as transfers, each (micro-batch, chunk) in an activation slot.
#include "meshtrain/plan/pipeline_program.h"

#include <map>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {
namespace {

using Transfer = ProgramEntry::Transfer;

Transfer transfer_of(const PipelineOp& op) {
  const bool activation = op.payload == PipelinePayload::activation;
  if (op.kind == PipelineOpKind::send)
    return activation ? Transfer::send_activation : Transfer::send_gradient;
  return activation ? Transfer::receive_activation : Transfer::receive_gradient;
}

// The chunk on this rank an op's tensor belongs to: a compute op's own; a send's producer (this rank's); a
// received activation is read by the next chunk's forward, a received gradient by the previous chunk's
// backward.
int64_t chunk_here(const PipelineOp& op) {
  if (op.kind == PipelineOpKind::receive)
    return op.payload == PipelinePayload::activation ? op.chunk + 1 : op.chunk - 1;
  return op.chunk;
}

// The split kernel a compute op runs.
KernelName kernel_of(PipelineOpKind kind) {
  switch (kind) {
    case PipelineOpKind::forward:
      return KernelName::forward;
    case PipelineOpKind::backward:
      return KernelName::backward;
    case PipelineOpKind::backward_input:
      return KernelName::backward_input;
    case PipelineOpKind::backward_weight:
      return KernelName::backward_weight;
    case PipelineOpKind::send:
    case PipelineOpKind::receive:
      break;
  }
  MT_CHECK(false, "a compute op");
  return KernelName::forward;
}

}  // namespace

StageProgram plan_stage_program(const PipelineSchedule& schedule, int64_t stage) {
  MT_CHECK(stage >= 0 && stage < schedule.stages, "a stage of the schedule");
  const std::vector<PipelineOp>& ops = schedule.ranks[static_cast<size_t>(stage)];
  // Each (micro-batch, chunk)'s last op, where its slot is freed: its backward, or zero_bubble's W (which
  // reads what its forward and its B_input left in the slot), or the send of its input gradient if that comes
  // later.
  using Key = std::pair<int64_t, int64_t>;
  std::map<Key, size_t> last_use;
  for (size_t i = 0; i < ops.size(); ++i) last_use[{ops[i].micro_batch, chunk_here(ops[i])}] = i;
  StageProgram result;
  std::vector<ProgramEntry>& entries = result.program.gradients;
  entries.push_back({KernelName::zero_gradients, ProgramEntry::kNoMicroBatch});
  std::map<Key, int64_t> slot_of;
  std::vector<bool> taken;
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    const Key key{op.micro_batch, chunk_here(op)};
    auto found = slot_of.find(key);
    if (found == slot_of.end()) {
      size_t free = 0;
      while (free < taken.size() && taken[free]) ++free;
      if (free == taken.size()) taken.push_back(false);
      taken[free] = true;
      found = slot_of.emplace(key, static_cast<int64_t>(free)).first;
    }
    ProgramEntry entry;
    entry.micro_batch = op.micro_batch;
    entry.chunk = key.second / schedule.stages;  // the rank's chunks in layer order: s, s + P, ...
    entry.slot = found->second;
    if (op.is_compute()) {
      entry.kernel = kernel_of(op.kind);
    } else {
      entry.transfer = transfer_of(op);
      entry.peer = op.peer;
    }
    entries.push_back(entry);
    if (last_use.at(key) == i) {
      taken[static_cast<size_t>(found->second)] = false;
      slot_of.erase(found);
    }
  }
  result.slots = static_cast<int64_t>(taken.size());
  result.program.update.push_back({KernelName::update, ProgramEntry::kNoMicroBatch});
  // Eval: one micro-batch forward through every chunk in layer order, the loss on the last: this rank's
  // chunks s, s + P, ... each receive, run and send on, in slot 0.
  for (int64_t local = 0; local < schedule.repeats; ++local) {
    const int64_t chunk = stage + local * schedule.stages;
    ProgramEntry entry{KernelName::eval, 0};
    entry.slot = 0;
    entry.chunk = local;
    if (chunk > 0) {
      ProgramEntry receive = entry;
      receive.transfer = Transfer::receive_activation;
      receive.peer = schedule.rank_of_chunk(chunk - 1);
      result.program.eval.push_back(receive);
    }
    result.program.eval.push_back(entry);
    if (chunk + 1 < schedule.chunks()) {
      ProgramEntry send = entry;
      send.transfer = Transfer::send_activation;
      send.peer = schedule.rank_of_chunk(chunk + 1);
      result.program.eval.push_back(send);
    }
  }
  return result;
}

}  // namespace meshtrain
