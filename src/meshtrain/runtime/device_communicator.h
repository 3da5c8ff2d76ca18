// The world communicator a run's collectives go through on its devices. The cpu, or one process: the
// launcher's (MPI, or the one-process backend) as it is. An NVIDIA topology with several processes: NCCL,
// one process per GPU (comm/nccl_communicator.cpp, built where NCCL is found), or, with share_gpus=true,
// MPI staged through host memory (comm/staged_communicator.h), so several processes share a GPU. Host
// buffers (loss sums, flags) go through MPI either way. Every rank calls it (NCCL's set-up is collective).
#pragma once

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {

std::unique_ptr<Communicator> communicator_for_devices(std::unique_ptr<Communicator> world,
                                                       const TrainingPlan& plan);

// Whether this build has the NCCL communicator (CMake found NCCL with the CUDA backend).
bool nccl_communicator_built();

}  // namespace meshtrain
