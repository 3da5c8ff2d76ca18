// The command table (commands.h), the help text made from it, and the dispatch of `meshtrain WORDS...`.
#include "meshtrain/cli/commands.h"

#include <sstream>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/cli/compile.h"
#include "meshtrain/cli/generate.h"
#include "meshtrain/cli/hf_interchange.h"
#include "meshtrain/cli/info.h"
#include "meshtrain/cli/launch.h"
#include "meshtrain/cli/measure_machine.h"
#include "meshtrain/cli/prepare.h"
#include "meshtrain/cli/tokenize.h"
#include "meshtrain/cli/train.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

constexpr const char* kConfigNote =
    "CONFIG is a preset name (configs/models/*.yaml) or a YAML path; key=value words override its keys "
    "(docs/configuration.md lists them all).";

std::vector<CommandSpec> make_table() {
  return {
      {"train",
       "train a model (resumes from the newest committed checkpoint in run_dir)",
       "train CONFIG [key=value ...]",
       "CONFIG",
       true,
       {},
       {kConfigNote,
        "Data: dataset_type=tokens (dataset_path / eval_dataset_path: `meshtrain prepare` output, "
        "tokenizer_path its tokenizer.json), text (dataset_path: a text file or a folder of them, 5% held "
        "out "
        "for evaluation; empty: the King James Bible) or synthetic (random ids from the seed, no files).",
        "Under mpirun every rank runs the same command; the mesh.* keys split the devices."},
       {"meshtrain train qwen3-tiny run_dir=runs/qwen3-tiny-kjv   # after: meshtrain prepare",
        "meshtrain train qwen3-tiny dataset_type=synthetic tokenizer_path= steps=10 run_dir=runs/tiny"}},
      {"launch",
       "train on a SLURM cluster or over an mpirun hostfile: write an sbatch script that saves and requeues "
       "on preemption, or start srun / mpirun",
       "launch CONFIG [key=value ...] --nodes N [--tasks-per-node T] [--cpus-per-task C] [--launcher-args "
       "ARGS] "
       "[--binary PATH] (--sbatch FILE [--time LIMIT] [--signal-seconds S] [--launcher mpirun|srun] "
       "[--job-name "
       "NAME] | --srun | --mpirun --hostfile FILE [--ssh-port P]) [--print-only | --dry-run]",
       "CONFIG",
       true,
       {{"--nodes", "N", "hosts to run on: SLURM nodes, or the first N hosts of the hostfile"},
        {"--tasks-per-node", "T", "ranks (MPI processes) on each host (default 1)"},
        {"--sbatch", "FILE",
         "mode: write a batch script to FILE (mode 0755) and print the `sbatch FILE` line that submits it"},
        {"--srun", "",
         "mode: inside an allocation (salloc, sbatch), run srun --mpi=pmix with the train command"},
        {"--mpirun", "", "mode: run mpirun over --hostfile after checking every host"},
        {"--hostfile", "FILE",
         "with --mpirun: an Open MPI hostfile, lines 'HOST [slots=N]'; its first N hosts get T ranks each"},
        {"--ssh-port", "P",
         "with --mpirun: the port each host other than this one must answer on (default 22: mpirun starts "
         "its daemons over ssh)"},
        {"--print-only", "", "with --srun or --mpirun: print the command, run nothing"},
        {"--dry-run", "", "the same as --print-only"},
        {"--cpus-per-task", "C",
         "cores per rank: #SBATCH --cpus-per-task and each rank bound to C cores (default: SLURM's default, "
         "ranks not bound)"},
        {"--time", "LIMIT",
         "with --sbatch: the job's time limit in SLURM's formats (90, 12:00:00, 2-00:00:00; default: the "
         "partition's)"},
        {"--signal-seconds", "S",
         "with --sbatch: SLURM sends SIGUSR1 to the batch shell S seconds before the time limit, which asks "
         "every rank to save (default 120)"},
        {"--launcher", "mpirun|srun", "with --sbatch: what starts the ranks in the job (default mpirun)"},
        {"--job-name", "NAME", "with --sbatch: the job's name (default meshtrain-<run_dir's last folder>)"},
        {"--launcher-args", "\"ARGS\"",
         "extra options for mpirun / srun, as one quoted word (e.g. \"--oversubscribe\" where a host has "
         "fewer cores than ranks)"},
        {"--binary", "PATH",
         "the meshtrain every rank runs (default: the absolute path of this one; the nodes must see it)"}},
       {kConfigNote,
        "Before anything is written or started, the config is resolved and its mesh checked against N x T "
        "ranks (as compile does). The script runs the launcher in the background, forwards SIGUSR1 and "
        "SIGTERM to it as SIGUSR1 (every rank saves at the next step boundary and exits), and requeues the "
        "job when train exits with status 75, \"checkpoint committed, requeue me\" (README.md, \"Launching "
        "on "
        "SLURM and hostfiles\").",
        "Running as root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 in the "
        "environment; launch does not add --allow-run-as-root."},
       {"meshtrain launch qwen3-0.6b run_dir=runs/q06 --nodes 4 --tasks-per-node 2 --time 12:00:00 --sbatch "
        "q06.sbatch",
        "meshtrain launch qwen3-tiny steps=10 --nodes 2 --mpirun --hostfile hosts.txt --print-only"}},
      {"info",
       "exact parameter counts and the training FLOPs per device per step",
       "info CONFIG [key=value ...]",
       "CONFIG",
       true,
       {},
       {kConfigNote, "Nothing is allocated: the model is declared, counted and priced."},
       {"meshtrain info qwen3-0.6b per_device_batch_size=1 max_target_length=2048"}},
      {"compile",
       "plan a run ahead of time: cost, memory and fit per kernel, for any topology",
       "compile CONFIG [topology=NAME mesh.X=N kernels=K,.. plan_out=STEM ...] [--explain | --search "
       "[--memory-budget SIZE]]",
       "CONFIG",
       true,
       {{"--explain", "", "also break memory down by buffer kind and layer"},
        {"--search", "",
         "rank the meshes, micro-batches and remat policies that fit the topology at the config's global "
         "batch"},
        {"--memory-budget", "SIZE",
         "with --search: the most one device's arena may use, such as 60GiB or 8GB (default: the device's "
         "memory)"}},
       {kConfigNote,
        "plan_out=STEM writes STEM_<kernel>.json plan files that a run reads back with plan_in=STEM."},
       {"meshtrain compile qwen3-8b topology=h100x8 mesh.fsdp=8 --explain",
        "meshtrain compile qwen3-8b topology=h100x8 --search --memory-budget=60GiB"}},
      {"generate",
       "sample a continuation of a prompt (text or token ids) from a checkpoint, on the CPU",
       "generate --checkpoint DIR (--prompt TEXT | --prompt-ids IDS) [--max-new-tokens N] [--temperature T] "
       "[--top-k K] [--top-p P] [--seed S] [--output text|ids|logits]",
       "",
       false,
       {{"--checkpoint", "DIR",
         "a checkpoint directory (step_<N>/), or a run_dir or checkpoints directory: its newest committed "
         "checkpoint"},
        {"--prompt", "TEXT", "the text to continue (encoded with the checkpoint's tokenizer copy)"},
        {"--prompt-ids", "IDS",
         "the token ids to continue instead: comma-separated (1,2,3), or @FILE for a file holding a JSON "
         "array of ids as `meshtrain tokenize` writes; needs no tokenizer"},
        {"--max-new-tokens", "N",
         "tokens to sample at most (default 100); the tokenizer's EOS stops earlier"},
        {"--temperature", "T", "softmax temperature (default 0.8; 0: greedy)"},
        {"--top-k", "K", "keep the K most likely tokens (default 0: off)"},
        {"--top-p", "P", "keep the smallest set holding probability P, in (0, 1] (default 1: off)"},
        {"--seed", "S", "sampling seed (default 0): the same flags and seed give the same tokens"},
        {"--output", "text|ids|logits",
         "text: the prompt and its continuation (default with --prompt; needs a tokenizer); ids: one JSON "
         "line {\"prompt\": [ids], \"generated\": [ids]} (default with --prompt-ids); logits: the same with "
         "the next-token logits after every fed token"}},
       {"Give exactly one of --prompt and --prompt-ids. The model is rebuilt from the checkpoint's own "
        "config; a checkpoint without a tokenizer copy (synthetic data, a Hugging Face import without "
        "tokenizer.json) generates from --prompt-ids only, with no EOS to stop at.",
        "Ids must lie in [0, vocab_size) of the checkpoint's model."},
       {"meshtrain generate --checkpoint runs/qwen3-tiny-kjv --prompt \"And God said\" --max-new-tokens 60 "
        "--seed 1",
        "meshtrain generate --checkpoint runs/tiny --prompt-ids 5,17,3 --max-new-tokens 8 --temperature 0"}},
      {"prepare",
       "tokenize a corpus into token shards: train a byte-level BPE tokenizer on it, or stream raw "
       "pre-training files (text, JSON Lines, Parquet) through a given one on every core",
       "prepare [--out DIR] [--vocab-size N] [--corpus PATH] [--validation-fraction F] | meshtrain prepare "
       "--corpus SOURCE --tokenizer PATH --out DIR [--column NAME] [--validation-fraction F] [--threads N]",
       "",
       false,
       {{"--out", "DIR", "output folder (default data/kjv; required with --tokenizer)"},
        {"--vocab-size", "N", "tokenizer size, <|endoftext|> included (default 8192; not with --tokenizer)"},
        {"--corpus", "PATH",
         "without --tokenizer: a text file or a folder of text files, one document per file (default: the "
         "King "
         "James Bible from Debian's bible-kjv, one document per chapter, every 20th chapter held out for "
         "validation). With --tokenizer: a file, folder or glob of .txt, .jsonl, .jsonl.gz, .jsonl.zst and "
         ".parquet files (quote a glob)"},
        {"--tokenizer", "PATH",
         "an existing tokenizer (a tokenizer.json, or a folder with tokenizer.json or encoder.json + "
         "vocab.bpe, as tokenizer_path); it must have <|endoftext|>, which ends every document. Selects the "
         "streaming path"},
        {"--column", "NAME",
         "with --tokenizer: the JSON Lines / Parquet column holding the text (default text; train's "
         "train_data_columns)"},
        {"--validation-fraction", "F",
         "share of the --corpus documents held out for validation, in [0, 1) (default 0.05; the KJV split is "
         "fixed). With --tokenizer: document j of each file when floor((j+1)F) > floor(jF)"},
        {"--threads", "N",
         "with --tokenizer: encoding threads (default: every core, shared among the ranks on a host under "
         "mpirun; the output is the same)"}},
       {"Without --tokenizer: writes DIR/tokenizer.json, DIR/train.tokens, DIR/validation.tokens and "
        "DIR/prepare.json; does nothing when DIR already holds complete outputs for the same arguments and "
        "corpus. Train with dataset_type=tokens dataset_path=DIR eval_dataset_path=DIR "
        "tokenizer_path=DIR/tokenizer.json.",
        "With --tokenizer: streams the files (never a whole one in memory), writes DIR/train/ and "
        "DIR/validation/ shards (one series per input file) and DIR/index.json last (docs/data.md); does "
        "nothing when the index matches the arguments, tokenizer and files. Under mpirun the files are split "
        "over the ranks; the shards are the same. Train with dataset_type=tokens dataset_path=DIR "
        "eval_dataset_path=DIR tokenizer_path=PATH.",
        "JSON Lines and Parquet sources need --tokenizer (train one with the default path on a text sample, "
        "or use the model's)."},
       {"meshtrain prepare --out data/kjv --vocab-size 8192",
        "meshtrain prepare --corpus my_texts/ --out data/mine --vocab-size 8192",
        "meshtrain prepare --corpus 'dolma/*.jsonl.zst' --tokenizer qwen3/tokenizer.json --out data/dolma",
        "meshtrain prepare --corpus fineweb/ --tokenizer gpt2/ --out data/fineweb --column text --threads "
        "16"}},
      {"tokenize",
       "encode stdin to a JSON array of token ids on stdout (or decode such an array)",
       "tokenize --tokenizer PATH [--decode]",
       "",
       false,
       {{"--tokenizer", "PATH",
         "a tokenizer.json, or a folder with tokenizer.json or encoder.json + vocab.bpe (as tokenizer_path)"},
        {"--decode", "", "read a JSON array of ids from stdin and write exactly the decoded bytes"}},
       {"Encoding reads stdin as raw bytes (nothing stripped) and writes only the JSON array and a newline; "
        "decoding adds no newline."},
       {"echo \"In the beginning\" | meshtrain tokenize --tokenizer data/kjv/tokenizer.json",
        "echo \"[818,262,3726]\" | meshtrain tokenize --tokenizer data/kjv/tokenizer.json --decode"}},
      {"import-hf",
       "a Hugging Face model folder -> a checkpoint of parameters to train on",
       "import-hf DIR --out CKPT [--config PRESET|YAML] [key=value ...]",
       "DIR",
       true,
       {{"--out", "CKPT", "the checkpoint directory to create"},
        {"--config", "PRESET|YAML",
         "the config to fill from the model's config.json (default: the preset of its family)"}},
       {"DIR holds config.json and *.safetensors (Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-2); key=value words "
        "override config keys. Start a run from it with load_parameters_path=CKPT (docs/interchange.md)."},
       {"meshtrain import-hf ~/models/Qwen3-0.6B --out runs/qwen3-0.6b-hf"}},
      {"export-hf",
       "a checkpoint -> a Hugging Face folder (transformers, vLLM, llama.cpp's converter)",
       "export-hf CKPT --out DIR [--dtype float32|bfloat16|float16] [--max-shard-size SIZE]",
       "CKPT",
       false,
       {{"--out", "DIR", "the Hugging Face folder to create"},
        {"--dtype", "float32|bfloat16|float16", "the stored weights' type (default float32)"},
        {"--max-shard-size", "SIZE", "the largest safetensors file, such as 5GB or 500MB (default 5GB)"}},
       {"CKPT is a checkpoint directory, or a run_dir / checkpoints directory: its newest committed "
        "checkpoint."},
       {"meshtrain export-hf runs/qwen3-0.6b-mine --out ~/models/Qwen3-0.6B-mine --dtype bfloat16"}},
      {"measure-machine",
       "time this machine's GEMM peaks, attention, the loss's softmax, elementwise ops and memory bandwidth, "
       "as a topology entry to plan with",
       "measure-machine [--out FILE] [--name NAME]",
       "",
       false,
       {{"--out", "FILE", "write the entry to FILE (default: print it)"},
        {"--name", "NAME",
         "the entry's name, letters, digits, '-' and '_' (default cpu: replaces the built-in entry)"}},
       {"Plan this machine with `meshtrain compile MODEL topologies_path=FILE topology=NAME`."},
       {"meshtrain measure-machine --out my-machine.yaml --name my-machine"}},
  };
}

// `text`'s words wrapped at 100 columns, starting at `column`; each further line is indented by `indent`.
std::string wrapped(const std::string& text, size_t column, size_t indent) {
  constexpr size_t kWidth = 100;
  std::istringstream words(text);
  std::string out, word;
  bool line_started = false;
  while (words >> word) {
    if (line_started && column + 1 + word.size() > kWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      line_started = false;
    }
    if (line_started) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    line_started = true;
  }
  return out;
}

}  // namespace

const std::vector<CommandSpec>& command_table() {
  static const std::vector<CommandSpec> table = make_table();
  return table;
}

const CommandSpec& find_command(const std::string& name) {
  std::vector<std::string> names;
  for (const CommandSpec& command : command_table()) {
    if (command.name == name) return command;
    names.push_back(command.name);
  }
  fail("meshtrain command '" + name + "'", "one of the commands (meshtrain help lists them)",
       "an unknown one", "did you mean '" + closest_name(name, names) + "'?");
}

std::string command_help(const CommandSpec& command) {
  std::string text = "meshtrain " + command.name + ": " + command.summary + "\n\n";
  text += "usage: " + wrapped("meshtrain " + command.usage, 7, 7) + "\n";
  if (!command.flags.empty()) {
    text += "\nflags:\n";
    constexpr size_t kHelpColumn = 36;
    for (const FlagSpec& flag : command.flags) {
      std::string name = "  " + flag.name + (flag.placeholder.empty() ? "" : " " + flag.placeholder);
      if (name.size() + 2 > kHelpColumn) {
        text += name + "\n";
        name.clear();
      }
      name.resize(kHelpColumn, ' ');
      text += name + wrapped(flag.help, kHelpColumn, kHelpColumn) + "\n";
    }
  }
  for (const std::string& note : command.notes) text += "\n" + wrapped(note, 0, 0) + "\n";
  text += command.examples.size() == 1 ? "\nexample:\n" : "\nexamples:\n";
  for (const std::string& example : command.examples) text += "  " + example + "\n";
  return text;
}

std::string commands_overview() {
  std::string text =
      "usage: meshtrain <command> [arguments]\n"
      "       meshtrain <command> --help, or meshtrain help <command>: its flags and examples\n"
      "commands:\n";
  for (const CommandSpec& command : command_table()) {
    std::string name = "  " + command.name;
    name.resize(19, ' ');
    text += name + wrapped(command.summary, 19, 19) + "\n";
  }
  text += "a config is a preset name (configs/models/*.yaml) or a YAML path; key=value overrides follow.\n";
  return text;
}

int run_command_line(const std::vector<std::string>& words, std::istream& in, std::ostream& out,
                     std::ostream& err) {
  if (words.empty()) {
    err << commands_overview();
    return 2;
  }
  if (words[0] == "help" || words[0] == "--help" || words[0] == "-h") {
    if (words.size() > 2) {
      fail("meshtrain help", "at most one command name", std::to_string(words.size() - 1) + " words",
           "e.g. meshtrain help generate");
    }
    out << (words.size() == 2 ? command_help(find_command(words[1])) : commands_overview());
    return 0;
  }
  const CommandSpec& command = find_command(words[0]);
  const std::vector<std::string> arguments(words.begin() + 1, words.end());
  if (asks_for_help(command, arguments)) {
    out << command_help(command);
    return 0;
  }
  if (command.name == "train") return run_train(arguments);
  if (command.name == "info") return run_info(arguments, out);
  if (command.name == "launch") return run_launch(arguments, out);
  if (command.name == "compile") return run_compile(arguments, out);
  if (command.name == "generate") return run_generate(arguments, out);
  if (command.name == "tokenize") return run_tokenize(arguments, in, out);
  if (command.name == "prepare") return run_prepare(arguments, out);
  if (command.name == "import-hf") return run_import_hf(arguments, out);
  if (command.name == "export-hf") return run_export_hf(arguments, out);
  MT_CHECK(command.name == "measure-machine", "every command in the table is dispatched");
  return run_measure_machine(arguments, out);
}

}  // namespace meshtrain
