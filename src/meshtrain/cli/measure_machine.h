// `meshtrain measure-machine [--out FILE] [--name NAME]`: times this machine's float32 GEMM and memory
// bandwidth and writes them as a topology entry (configs/topologies.yaml's format) for `topologies_path`.
// The built-in `cpu` entry states its peaks so that a plan is the same on every machine; this is how a user
// asks for a plan of *this* machine instead: `meshtrain compile MODEL topologies_path=FILE`.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

// Measures, then writes the entry to --out (atomically) or, without --out, to `out`; the figures and the
// way to use the file are printed as YAML comments, so what reaches `out` is always a valid catalog.
int run_measure_machine(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
