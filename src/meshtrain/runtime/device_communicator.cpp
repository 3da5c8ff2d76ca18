// The world communicator for a run's devices (device_communicator.h).
#include "meshtrain/runtime/device_communicator.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>

#include "meshtrain/comm/staged_communicator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"

namespace meshtrain {
namespace {

// NCCL over `mpi`, from libmeshtrain_comm_nccl.so beside this library (loaded only here, so a cpu run never
// maps NCCL); a MeshError saying why where it cannot be.
std::unique_ptr<Communicator> nccl_communicator(std::unique_ptr<Communicator> mpi) {
#ifdef MESHTRAIN_WITH_NCCL
  const std::string fix =
      "reinstall meshtrain's libraries of this build, with NCCL's libnccl.so.2 where it runs";
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&communicator_for_devices), &self) == 0 || self.dli_fname == nullptr) {
    fail("NCCL", "the NCCL communicator's library", "dladdr could not locate this library", fix);
  }
  const std::string path =
      (std::filesystem::path(self.dli_fname).parent_path() / "libmeshtrain_comm_nccl.so").string();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process's life
  if (library == nullptr) fail("NCCL", "the NCCL communicator's library " + path, dlerror(), fix);
  using Entry = Communicator* (*)(Communicator * mpi);
  const auto entry = reinterpret_cast<Entry>(dlsym(library, "meshtrain_nccl_communicator"));
  if (entry == nullptr)
    fail("NCCL", "meshtrain_nccl_communicator in " + path, "a library of another build", fix);
  return std::unique_ptr<Communicator>(entry(mpi.release()));  // it owns the MPI communicator from here
#else
  static_cast<void>(mpi);
  MT_CHECK(false, "NCCL asked for in a build without it (check_plan_runs_here refuses that)");
  return nullptr;
#endif
}

}  // namespace

bool nccl_communicator_built() {
#ifdef MESHTRAIN_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> communicator_for_devices(std::unique_ptr<Communicator> world,
                                                       const TrainingPlan& plan) {
  const kernels::KernelBackend& device = *plan.spec.kernels;
  if (world->size() == 1 || device.memory_on_host()) return world;
  if (plan.spec.config.share_gpus) {
    return stage_through_host(std::move(world),
                              {device.memory_is_device, device.memory_copy_in, device.memory_copy_out});
  }
  return nccl_communicator(std::move(world));
}

}  // namespace meshtrain
