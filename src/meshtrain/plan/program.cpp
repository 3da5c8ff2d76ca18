// The planner's program pass: today's step schedule (micro-batches in order, then the update).
#include "meshtrain/plan/program.h"

#include <algorithm>

#include "meshtrain/plan/plan.h"

namespace meshtrain {

StepProgram plan_step_program(int64_t gradient_accumulation_steps) {
  StepProgram program;
  for (int64_t micro = 0; micro < gradient_accumulation_steps; ++micro) {
    program.gradients.push_back({micro == 0 ? KernelName::fwd_bwd : KernelName::fwd_bwd_accum, micro, 0,
                                 micro + 1 == gradient_accumulation_steps});
  }
  program.update.push_back({KernelName::update, ProgramEntry::kNoMicroBatch, 0, false});
  program.eval.push_back({KernelName::eval, 0, 0, false});
  return program;
}

std::vector<KernelName> program_kernels(const std::vector<ProgramEntry>& entries) {
  std::vector<KernelName> kernels;
  for (const ProgramEntry& entry : entries) {
    if (entry.transfer != ProgramEntry::Transfer::none) continue;
    if (std::find(kernels.begin(), kernels.end(), entry.kernel) == kernels.end())
      kernels.push_back(entry.kernel);
  }
  return kernels;
}

}  // namespace meshtrain
