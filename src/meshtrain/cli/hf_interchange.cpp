// Flag parsing of import-hf / export-hf (hf_interchange.h): one positional folder, --flag VALUE or
// --flag=VALUE, and (import) key=value config overrides.
#include "meshtrain/cli/hf_interchange.h"

#include <algorithm>
#include <map>
#include <optional>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/core/error.h"
#include "meshtrain/interchange/hf_interchange.h"

namespace meshtrain {
namespace {

constexpr const char* kImportUsage =
    "meshtrain import-hf DIR --out CKPT [--config PRESET|YAML] [key=value ...]";
constexpr const char* kExportUsage =
    "meshtrain export-hf CKPT --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size 5GB]";

struct ParsedWords {
  std::optional<std::string> positional;
  std::map<std::string, std::string> flags;
  std::vector<std::string> overrides;
};

ParsedWords parse_words(const std::string& command, const std::vector<std::string>& words,
                        const std::vector<std::string>& known, bool overrides_allowed, const char* usage) {
  ParsedWords parsed;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.starts_with("--")) {
      const size_t equals = word.find('=');
      const std::string flag = word.substr(0, equals);
      if (std::find(known.begin(), known.end(), flag) == known.end()) {
        fail("meshtrain " + command + " argument '" + word + "'", "one of its flags", "an unknown flag",
             "did you mean '" + closest_name(flag, known) + "'? usage: " + usage);
      }
      std::string value;
      if (equals != std::string::npos) {
        value = word.substr(equals + 1);
      } else {
        if (i + 1 == words.size())
          fail("meshtrain " + command + " " + flag, "a value after it", "nothing", usage);
        value = words[++i];
      }
      if (!parsed.flags.emplace(flag, value).second)
        fail("meshtrain " + command + " " + flag, "the flag once", "given twice", "keep one of the two");
    } else if (word.find('=') != std::string::npos && overrides_allowed) {
      parsed.overrides.push_back(word);
    } else if (!parsed.positional) {
      parsed.positional = word;
    } else {
      fail("meshtrain " + command + " argument '" + word + "'", "one folder", "a second one", usage);
    }
  }
  return parsed;
}

std::string required(const ParsedWords& parsed, const std::string& command, const std::string& flag,
                     const std::string& what, const char* usage) {
  const auto it = parsed.flags.find(flag);
  if (it == parsed.flags.end() || it->second.empty())
    fail("meshtrain " + command + " " + flag, what, "none given", usage);
  return it->second;
}

}  // namespace

int run_import_hf(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedWords parsed = parse_words("import-hf", arguments, {"--out", "--config"}, true, kImportUsage);
  HfImportOptions options;
  if (!parsed.positional) {
    fail("meshtrain import-hf", "the Hugging Face model folder (config.json + safetensors)", "none given",
         kImportUsage);
  }
  options.hf_directory = *parsed.positional;
  options.out = required(parsed, "import-hf", "--out", "the checkpoint directory to create", kImportUsage);
  if (const auto it = parsed.flags.find("--config"); it != parsed.flags.end()) options.config = it->second;
  options.overrides = parsed.overrides;
  import_hugging_face(options, out);
  return 0;
}

int run_export_hf(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedWords parsed =
      parse_words("export-hf", arguments, {"--out", "--dtype", "--max-shard-size"}, false, kExportUsage);
  HfExportOptions options;
  if (!parsed.positional) {
    fail("meshtrain export-hf", "a checkpoint directory (or a run_dir)", "none given", kExportUsage);
  }
  options.checkpoint = *parsed.positional;
  options.out = required(parsed, "export-hf", "--out", "the Hugging Face folder to create", kExportUsage);
  if (const auto it = parsed.flags.find("--dtype"); it != parsed.flags.end()) options.dtype = it->second;
  if (const auto it = parsed.flags.find("--max-shard-size"); it != parsed.flags.end())
    options.max_shard_bytes = parse_byte_size("--max-shard-size", it->second);
  export_hugging_face(options, out);
  return 0;
}

}  // namespace meshtrain
