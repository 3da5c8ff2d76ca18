// import-hf / export-hf (hf_interchange.h): their arguments (one folder, flags and, for import, key=value
// config overrides; commands.cpp lists them) into the interchange options.
#include "meshtrain/cli/hf_interchange.h"

#include "meshtrain/cli/arguments.h"
#include "meshtrain/interchange/hf_interchange.h"

namespace meshtrain {

int run_import_hf(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("import-hf"), arguments);
  HfImportOptions options;
  options.hf_directory =
      parsed.required_positional("the Hugging Face model folder (config.json + safetensors)");
  options.out = parsed.required("--out", "the checkpoint directory to create");
  if (const std::string* value = parsed.value("--config")) options.config = *value;
  options.overrides = parsed.overrides;
  import_hugging_face(options, out);
  return 0;
}

int run_export_hf(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("export-hf"), arguments);
  HfExportOptions options;
  options.checkpoint = parsed.required_positional("a checkpoint directory (or a run_dir)");
  options.out = parsed.required("--out", "the Hugging Face folder to create");
  if (const std::string* value = parsed.value("--dtype")) options.dtype = *value;
  if (const std::string* value = parsed.value("--max-shard-size"))
    options.max_shard_bytes = parse_byte_size("--max-shard-size", *value);
  export_hugging_face(options, out);
  return 0;
}

}  // namespace meshtrain
