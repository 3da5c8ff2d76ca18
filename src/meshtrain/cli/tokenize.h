// `meshtrain tokenize --tokenizer PATH [--decode]`: text on stdin -> JSON array of ids on stdout, or back.
#pragma once

#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// Encoding reads all of `in` as raw bytes (nothing stripped) and writes only a JSON array of ids, such as
// `[9707,1879]`, followed by one newline. `--decode` reads a JSON array of ids and writes exactly the bytes
// they stand for, nothing added. Bad arguments, bad JSON and unknown ids are MeshErrors. Returns 0.
int run_tokenize(const std::vector<std::string>& arguments, std::istream& in, std::ostream& out);

}  // namespace meshtrain
