// `meshtrain import-hf` and `meshtrain export-hf`: flags around interchange/hf_interchange.h.
//   meshtrain import-hf DIR --out CKPT [--config PRESET|YAML] [key=value ...]
//   meshtrain export-hf CKPT --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size 5GB]
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshtrain {

int run_import_hf(const std::vector<std::string>& arguments, std::ostream& out);
int run_export_hf(const std::vector<std::string>& arguments, std::ostream& out);

}  // namespace meshtrain
