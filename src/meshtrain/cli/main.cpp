// meshtrain: the command-line entry point. Each command lives in its own file under cli/.
#include <iostream>
#include <string>
#include <vector>

#include "meshtrain/cli/compile.h"
#include "meshtrain/cli/generate.h"
#include "meshtrain/cli/hf_interchange.h"
#include "meshtrain/cli/info.h"
#include "meshtrain/cli/measure_machine.h"
#include "meshtrain/cli/prepare.h"
#include "meshtrain/cli/tokenize.h"
#include "meshtrain/cli/train.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

namespace {

void print_usage(std::ostream& out) {
  out << "usage: meshtrain <command> <config> [key=value ...]\n"
         "commands:\n"
         "  train <config> [key=value ...]  train (resumes from run_dir's newest checkpoint)\n"
         "  info <config> [key=value ...]   exact parameter counts and training FLOPs per device per step\n"
         "  compile <config> [topology=NAME mesh.X=N kernels=K,.. plan_out=STEM ...]\n"
         "          [--explain | --search [--memory-budget=SIZE]]\n"
         "                                  ahead-of-time plan: cost, memory, fit per kernel\n"
         "  generate --checkpoint DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P "
         "--seed S --output text|ids|logits]\n"
         "  prepare [--out DIR] [--vocab-size N] [--corpus PATH]  tokenizer + token shards (default: the "
         "KJV)\n"
         "  tokenize --tokenizer PATH [--decode]  stdin text -> JSON ids on stdout (or the reverse)\n"
         "  import-hf DIR --out CKPT [--config PRESET|YAML] [key=value ...]  a Hugging Face model folder -> "
         "a\n"
         "                                  checkpoint (parameters) to train on with load_parameters_path\n"
         "  export-hf CKPT --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size 5GB]\n"
         "                                  a checkpoint -> a Hugging Face folder (transformers, vLLM, "
         "llama.cpp)\n"
         "  measure-machine [--out FILE] [--name NAME]  this machine's GEMM peak and memory bandwidth as a\n"
         "                                  topology entry: plan this machine with topologies_path=FILE\n"
         "a config is a preset name (configs/models/*.yaml) or a YAML path; key=value overrides follow.\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty() || words[0] == "--help" || words[0] == "-h" || words[0] == "help") {
    print_usage(words.empty() ? std::cerr : std::cout);
    return words.empty() ? 2 : 0;
  }
  const std::vector<std::string> arguments(words.begin() + 1, words.end());
  try {
    if (words[0] == "train") return meshtrain::run_train(arguments);
    if (words[0] == "info") return meshtrain::run_info(arguments, std::cout);
    if (words[0] == "compile") return meshtrain::run_compile(arguments, std::cout);
    if (words[0] == "generate") return meshtrain::run_generate(arguments, std::cout);
    if (words[0] == "tokenize") return meshtrain::run_tokenize(arguments, std::cin, std::cout);
    if (words[0] == "prepare") return meshtrain::run_prepare(arguments, std::cout);
    if (words[0] == "import-hf") return meshtrain::run_import_hf(arguments, std::cout);
    if (words[0] == "export-hf") return meshtrain::run_export_hf(arguments, std::cout);
    if (words[0] == "measure-machine") return meshtrain::run_measure_machine(arguments, std::cout);
    std::cerr << "meshtrain: unknown command '" << words[0] << "' (did you mean '"
              << meshtrain::closest_name(words[0], {"train", "info", "compile", "generate", "tokenize",
                                                    "prepare", "import-hf", "export-hf", "measure-machine"})
              << "'?)\n";
    print_usage(std::cerr);
    return 2;
  } catch (const meshtrain::AlreadyReported& reported) {
    return reported.exit_code;
  } catch (const meshtrain::MeshError& error) {
    std::cerr << "meshtrain: error: " << error.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "meshtrain: internal error (please report it): " << error.what() << "\n";
    return 3;
  }
}
