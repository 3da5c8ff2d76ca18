// `meshtrain info <config> [key=value ...]`: exact parameter counts and standard training FLOPs.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

int run_info(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
