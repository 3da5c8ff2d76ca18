// The gradients phase of one step as a pipeline schedule runs it on one stage, over the split kernels
// (plan.h's ActivationStash; zero_bubble's backward_input and backward_weight): the programs the split-kernel
// tests compare with the fused step.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/plan/pipeline_program.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/program.h"

namespace meshtrain::testing {

inline ProgramEntry split_entry(KernelName kernel, int64_t micro_batch, int64_t slot) {
  ProgramEntry entry{kernel, micro_batch};
  entry.slot = slot;
  return entry;
}

// GPipe: F0 F1 .. F(M-1) B0 B1 .. B(M-1), micro-batch m in slot m (M slots).
inline std::vector<ProgramEntry> gpipe_gradients(int64_t micro_batches) {
  std::vector<ProgramEntry> entries = {{KernelName::zero_gradients}};
  for (int64_t m = 0; m < micro_batches; ++m) entries.push_back(split_entry(KernelName::forward, m, m));
  for (int64_t m = 0; m < micro_batches; ++m) entries.push_back(split_entry(KernelName::backward, m, m));
  return entries;
}

// 1F1B as the first of `in_flight` stages runs it: `in_flight` forwards, then each backward followed by the
// next forward (M = 4, 2 slots: F0 F1 B0 F2 B1 F3 B2 B3), micro-batch m in slot m % in_flight.
inline std::vector<ProgramEntry> one_f_one_b_gradients(int64_t micro_batches, int64_t in_flight) {
  std::vector<ProgramEntry> entries = {{KernelName::zero_gradients}};
  for (int64_t m = 0; m < in_flight; ++m) entries.push_back(split_entry(KernelName::forward, m, m));
  for (int64_t m = 0; m < micro_batches; ++m) {
    entries.push_back(split_entry(KernelName::backward, m, m % in_flight));
    const int64_t next = m + in_flight;
    if (next < micro_batches) entries.push_back(split_entry(KernelName::forward, next, next % in_flight));
  }
  return entries;
}

// ZB-H1 as stage `stage` of `stages` runs it (plan_stage_program's entries, without the transfers: here the
// whole model runs on one process), and the activation slots it needs.
struct SplitGradients {
  std::vector<ProgramEntry> entries;
  int64_t slots = 0;
};
inline SplitGradients zero_bubble_gradients(int64_t micro_batches, int64_t stages, int64_t stage) {
  const StageProgram program = plan_stage_program(
      build_pipeline_schedule(PipelineScheduleKind::zero_bubble, stages, micro_batches, 1), stage);
  SplitGradients result{{}, program.slots};
  for (const ProgramEntry& entry : program.program.gradients) {
    if (entry.transfer == ProgramEntry::Transfer::none) result.entries.push_back(entry);
  }
  return result;
}

// Every forward, then every B_input, then every W, micro-batch m in slot m (M slots): W as late as it goes.
inline std::vector<ProgramEntry> weights_last_gradients(int64_t micro_batches) {
  std::vector<ProgramEntry> entries = {{KernelName::zero_gradients}};
  for (KernelName kernel : {KernelName::forward, KernelName::backward_input, KernelName::backward_weight}) {
    for (int64_t m = 0; m < micro_batches; ++m) entries.push_back(split_entry(kernel, m, m));
  }
  return entries;
}

}  // namespace meshtrain::testing
