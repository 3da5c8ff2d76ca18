// `meshtrain compile <config> [topology=NAME] [mesh.*=N] [kernels=...] [plan_out=STEM] [key=value ...]
// [--explain | --search]`: the ahead-of-time plan (shared/specs/aot-plan.md) on this machine, with no
// accelerator and nothing allocated. Prints per kernel the cost and memory figures and the fit verdict of the
// process arena; --explain breaks memory down by layer and buffer kind; --search ranks the meshes,
// micro-batches and remat policies that fit the topology at the config's global batch (plan/search.h).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

int run_compile(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
