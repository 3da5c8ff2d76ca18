// `meshtrain train <config> [key=value ...]`: trains, resuming from run_dir's newest checkpoint.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

int run_train(const std::vector<std::string>& arguments);

}  // namespace meshtrain
