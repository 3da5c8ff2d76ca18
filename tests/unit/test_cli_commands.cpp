// Tests for the command table and the shared argument parser (cli/commands.h, cli/arguments.h): every
// command's help (three spellings, exit 0, usage, flags and an example), the overview, and the hints of bad
// arguments, which name the command's own flags and keys.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/cli/arguments.h"
#include "meshtrain/cli/commands.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

struct Outcome {
  int status = -1;
  std::string out, err;
};

Outcome run(const std::vector<std::string>& words) {
  std::istringstream in;
  std::ostringstream out, err;
  Outcome outcome;
  outcome.status = run_command_line(words, in, out, err);
  outcome.out = out.str();
  outcome.err = err.str();
  return outcome;
}

std::string error_of(const std::vector<std::string>& words) {
  return testing::error_of([&] { run(words); });
}

TEST(CommandHelp, EveryCommandPrintsItsUsageFlagsAndAnExample) {
  const std::vector<std::string> expected = {"train",     "launch",         "info",     "compile",
                                             "generate",  "prepare",        "tokenize", "import-hf",
                                             "export-hf", "measure-machine"};
  std::vector<std::string> names;
  for (const CommandSpec& command : command_table()) names.push_back(command.name);
  EXPECT_EQ(names, expected);
  for (const CommandSpec& command : command_table()) {
    const Outcome help = run({command.name, "--help"});
    EXPECT_EQ(help.status, 0) << command.name;
    EXPECT_TRUE(help.err.empty()) << command.name;
    EXPECT_TRUE(contains(help.out, "usage: meshtrain " + command.name)) << help.out;
    EXPECT_TRUE(contains(help.out, "example")) << help.out;
    EXPECT_FALSE(command.examples.empty()) << command.name;
    for (const std::string& example : command.examples) {
      EXPECT_TRUE(example.starts_with("meshtrain " + command.name + " ") || contains(example, "| meshtrain "))
          << example;
      EXPECT_TRUE(contains(help.out, example)) << command.name;
    }
    for (const FlagSpec& flag : command.flags) {
      EXPECT_TRUE(contains(help.out, flag.name + (flag.placeholder.empty() ? "" : " " + flag.placeholder)))
          << command.name << " " << flag.name;
      EXPECT_TRUE(contains(command.usage, flag.name)) << command.name << " usage lacks " << flag.name;
    }
    // The same text from `-h`, from `help CMD`, and with --help after other words.
    EXPECT_EQ(run({command.name, "-h"}).out, help.out);
    EXPECT_EQ(run({"help", command.name}).out, help.out);
    EXPECT_EQ(run({command.name, "somewhere", "x=1", "--help"}).out, help.out);
  }
}

TEST(CommandHelp, OverviewListsEveryCommand) {
  for (const std::vector<std::string>& words :
       std::vector<std::vector<std::string>>{{"help"}, {"--help"}, {"-h"}}) {
    const Outcome overview = run(words);
    EXPECT_EQ(overview.status, 0);
    for (const CommandSpec& command : command_table()) {
      EXPECT_TRUE(contains(overview.out, "  " + command.name + " ")) << command.name;
      EXPECT_TRUE(contains(overview.out, command.summary.substr(0, 30))) << command.name;
    }
  }
  const Outcome nothing = run({});
  EXPECT_EQ(nothing.status, 2);
  EXPECT_TRUE(nothing.out.empty());
  EXPECT_TRUE(contains(nothing.err, "usage: meshtrain <command>"));
}

TEST(CommandHelp, UnknownCommandsSuggestTheClosest) {
  const std::string help = error_of({"help", "genrate"});
  EXPECT_TRUE(contains(help, "'genrate'")) << help;
  EXPECT_TRUE(contains(help, "did you mean 'generate'?")) << help;
  EXPECT_TRUE(contains(error_of({"tokenise"}), "did you mean 'tokenize'?"));
  EXPECT_TRUE(contains(error_of({"help", "train", "info"}), "at most one command name"));
}

TEST(CommandHelp, AFlagsValueIsNoHelpRequest) {
  // `--prompt -h` continues the text "-h": the command runs (and fails on the missing checkpoint).
  const std::string error = error_of({"generate", "--checkpoint", "/nonexistent/run", "--prompt", "-h"});
  EXPECT_TRUE(contains(error, "/nonexistent/run")) << error;
}

TEST(ArgumentParser, UnknownFlagsSuggestTheCommandsOwnFlags) {
  for (const CommandSpec& command : command_table()) {
    for (const FlagSpec& flag : command.flags) {
      const std::string typo = flag.name + "x";
      const std::string error = testing::error_of([&] { parse_arguments(command, {typo}); });
      EXPECT_TRUE(contains(error, "meshtrain " + command.name + " argument '" + typo + "'")) << error;
      EXPECT_TRUE(contains(error, "did you mean '" + flag.name + "'?")) << error;
      EXPECT_TRUE(contains(error, "meshtrain " + command.name + " --help")) << error;
    }
  }
  // A command without flags says so, and a config key written as a flag is shown as key=value.
  EXPECT_TRUE(contains(error_of({"info", "qwen3-tiny", "--verbose"}), "takes no flags"));
  const std::string key = error_of({"train", "qwen3-tiny", "--steps=3"});
  EXPECT_TRUE(contains(key, "write steps=3")) << key;
  EXPECT_TRUE(contains(error_of({"compile", "qwen3-tiny", "--per-device-batch-size", "2"}),
                       "write per_device_batch_size=VALUE"));
}

TEST(ArgumentParser, ValuesPositionalsAndOverrides) {
  const CommandSpec& import = find_command("import-hf");
  const ParsedArguments spaced =
      parse_arguments(import, {"hf", "--out", "ckpt", "steps=3", "--config=qwen3-tiny"});
  EXPECT_EQ(spaced.positional, "hf");
  EXPECT_EQ(*spaced.value("--out"), "ckpt");
  EXPECT_EQ(*spaced.value("--config"), "qwen3-tiny");
  EXPECT_EQ(spaced.overrides, std::vector<std::string>{"steps=3"});
  // Without config overrides a word with '=' is the positional word (a path may hold one).
  EXPECT_EQ(parse_arguments(find_command("export-hf"), {"a=b", "--out", "x"}).positional, "a=b");
  const CommandSpec& compile = find_command("compile");
  const ParsedArguments switches =
      parse_arguments(compile, {"qwen3-tiny", "--search", "--memory-budget", "8GiB"});
  EXPECT_TRUE(switches.has("--search"));
  EXPECT_FALSE(switches.has("--explain"));
  EXPECT_EQ(*switches.value("--memory-budget"), "8GiB");
  EXPECT_EQ(switches.config(), "qwen3-tiny");

  const auto error = [](const CommandSpec& command, const std::vector<std::string>& words) {
    return testing::error_of([&] { parse_arguments(command, words); });
  };
  EXPECT_TRUE(contains(error(compile, {"qwen3-tiny", "--explain=yes"}), "write --explain alone"));
  EXPECT_TRUE(contains(error(compile, {"qwen3-tiny", "--memory-budget"}), "SIZE after it"));
  EXPECT_TRUE(contains(error(import, {"hf", "--out", "a", "--out=b"}), "given twice"));
  EXPECT_TRUE(contains(error(import, {"hf", "other"}), "a second word after 'hf'"));
  EXPECT_TRUE(contains(error(find_command("tokenize"), {"file.txt"}), "flags only"));
  EXPECT_TRUE(contains(testing::error_of([&] { parse_arguments(compile, {"--explain"}).config(); }),
                       "a preset name"));
}

}  // namespace
}  // namespace meshtrain
