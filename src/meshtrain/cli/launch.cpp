// `meshtrain launch`: the flags read and checked, then the sbatch script written or srun / mpirun started.
#include "meshtrain/cli/launch.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/launch/hostfile.h"
#include "meshtrain/launch/launch.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr int kConnectTimeoutSeconds = 5;      // a host that answers at all answers well within it
constexpr int64_t kMostSignalSeconds = 65535;  // the largest offset SLURM's --signal takes

// The flags that belong to one mode only.
struct ModeFlag {
  const char* flag;
  const char* mode;
};
constexpr ModeFlag kModeFlags[] = {
    {"--hostfile", "--mpirun"}, {"--ssh-port", "--mpirun"},       {"--launcher", "--sbatch"},
    {"--time", "--sbatch"},     {"--signal-seconds", "--sbatch"}, {"--job-name", "--sbatch"},
};

// A path written into an #SBATCH line: sbatch splits directives at blanks and reads % as a pattern.
void check_directive_path(const std::string& where, const std::string& path) {
  if (path.find_first_of(" \t\n'\"\\%") != std::string::npos) {
    fail(where, "a path without blanks, quotes, backslashes or % (it goes into an #SBATCH line)",
         "'" + path + "'", "choose a run_dir and working folder without them");
  }
}

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream stream(text);
  std::vector<std::string> words;
  for (std::string word; stream >> word;) words.push_back(word);
  return words;
}

int write_batch_script(const ParsedArguments& parsed, const LaunchRequest& request, const Config& config,
                       std::ostream& out) {
  const std::string file = *parsed.value("--sbatch");
  if (file.empty())
    fail(parsed.where("--sbatch"), "the path of the script to write", "none", parsed.usage_hint());
  BatchScript script;
  const std::string launcher = parsed.has("--launcher") ? *parsed.value("--launcher") : "mpirun";
  if (launcher != "mpirun" && launcher != "srun") {
    fail(parsed.where("--launcher"), "mpirun or srun", "'" + launcher + "'",
         "--launcher mpirun (Open MPI reads the allocation) or --launcher srun (srun --mpi=pmix)");
  }
  script.launcher = launcher == "srun" ? Launcher::srun : Launcher::mpirun;
  script.signal_seconds = parsed.integer("--signal-seconds", 120, 1);
  if (script.signal_seconds > kMostSignalSeconds) {
    fail(parsed.where("--signal-seconds"),
         "at most " + std::to_string(kMostSignalSeconds) + " (SLURM's limit)",
         std::to_string(script.signal_seconds), "give a shorter warning time");
  }
  if (parsed.has("--time")) {
    script.time_limit = *parsed.value("--time");
    const int64_t limit = slurm_time_seconds(parsed.where("--time"), script.time_limit);
    if (limit > 0 && script.signal_seconds >= limit) {
      fail(parsed.where("--signal-seconds"),
           "fewer seconds than the time limit (" + std::to_string(limit) + " s from --time " +
               script.time_limit + "), so that the job trains before SIGUSR1 asks it to save",
           std::to_string(script.signal_seconds), "lower --signal-seconds or raise --time");
    }
  }
  const fs::path run_dir = fs::absolute(config.run_dir).lexically_normal();
  script.output_directory = run_dir.string();
  script.working_directory = fs::current_path().string();
  check_directive_path("config key 'run_dir'", script.output_directory);
  check_directive_path("meshtrain launch's working folder", script.working_directory);
  script.job_name =
      parsed.has("--job-name") ? *parsed.value("--job-name") : "meshtrain-" + run_dir.filename().string();
  if (script.job_name.empty() ||
      script.job_name.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != std::string::npos) {
    fail(parsed.where("--job-name"), "letters, digits, '.', '_' and '-'", "'" + script.job_name + "'",
         "give --job-name NAME");
  }
  // SLURM does not create the folder of --output: a job whose folder is missing fails with no output at all.
  std::error_code error;
  fs::create_directories(run_dir, error);
  if (error) {
    fail("config key 'run_dir'", "a folder meshtrain can create (the job's output goes there)",
         script.output_directory + ": " + error.message(), "choose a writable run_dir");
  }
  write_file_atomically(file, sbatch_script(request, script), 0755);
  out << "# " << file << ": meshtrain train on " << request.nodes << " x " << request.tasks_per_node
      << " ranks under " << launcher << "; SIGUSR1 " << script.signal_seconds
      << " s before the time limit or SIGTERM makes every rank save, and exit status " << kRequeueExitStatus
      << " requeues the job. Submit it with:\n";
  out << shell_line({"sbatch", file}) << "\n";
  return 0;
}

}  // namespace

int run_launch(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("launch"), arguments);
  std::vector<std::string> modes;
  for (const char* mode : {"--sbatch", "--srun", "--mpirun"}) {
    if (parsed.has(mode)) modes.push_back(mode);
  }
  if (modes.size() != 1) {
    std::string given;
    for (const std::string& mode : modes) given += (given.empty() ? "" : " and ") + mode;
    fail("meshtrain launch", "exactly one mode: --sbatch FILE, --srun or --mpirun --hostfile FILE",
         modes.empty() ? "none" : given, parsed.usage_hint());
  }
  const std::string mode = modes.front();
  for (const ModeFlag& only : kModeFlags) {
    if (parsed.has(only.flag) && mode != only.mode) {
      fail(parsed.where(only.flag), std::string("it with ") + only.mode, "it with " + mode,
           std::string("drop ") + only.flag + " or use " + only.mode);
    }
  }
  const bool print_only = parsed.has("--print-only") || parsed.has("--dry-run");
  if (print_only && mode == "--sbatch") {
    fail(parsed.where(parsed.has("--print-only") ? "--print-only" : "--dry-run"),
         "it with --srun or --mpirun", "it with --sbatch",
         "drop it: --sbatch only writes the script, which `sbatch FILE` submits");
  }
  if (!parsed.has("--nodes"))
    fail(parsed.where("--nodes"), "the number of nodes", "none given", parsed.usage_hint());
  LaunchRequest request;
  request.config = parsed.config();
  request.overrides = parsed.overrides;
  request.nodes = parsed.integer("--nodes", 1, 1);
  request.tasks_per_node = parsed.integer("--tasks-per-node", 1, 1);
  request.cpus_per_task = parsed.integer("--cpus-per-task", 0, 1);
  if (parsed.has("--launcher-args")) request.launcher_extra = words_of(*parsed.value("--launcher-args"));
  request.binary =
      parsed.has("--binary") ? *parsed.value("--binary") : fs::read_symlink("/proc/self/exe").string();
  if (request.binary.empty())
    fail(parsed.where("--binary"), "the meshtrain every rank runs", "an empty path");
  // Before anything is written or started: the config resolves and its mesh fits the ranks.
  const Config config = check_launch_config(request);

  if (mode == "--sbatch") return write_batch_script(parsed, request, config, out);
  std::vector<std::string> command;
  if (mode == "--srun") {
    if (!print_only && std::getenv("SLURM_JOB_ID") == nullptr) {
      fail(parsed.where("--srun"), "a SLURM allocation to run in (SLURM_JOB_ID set)",
           "SLURM_JOB_ID is not set: this shell is outside any allocation",
           "run it inside `salloc -N " + std::to_string(request.nodes) + " --ntasks-per-node " +
               std::to_string(request.tasks_per_node) +
               "` or an sbatch script, or write a batch script with --sbatch FILE and submit it");
    }
    command = srun_command(request);
  } else {
    const std::string hostfile =
        parsed.required("--hostfile", "an Open MPI hostfile (lines 'HOST [slots=N]')");
    const int64_t port = parsed.integer("--ssh-port", 22, 1);
    if (port > 65535) fail(parsed.where("--ssh-port"), "a TCP port, 1 to 65535", std::to_string(port));
    check_hostfile_hosts(hostfile, read_hostfile(hostfile), request.nodes, request.tasks_per_node,
                         static_cast<int>(port), kConnectTimeoutSeconds);
    command = mpirun_hostfile_command(request, hostfile);
  }
  out << shell_line(command) << std::endl;
  if (print_only) return 0;
  run_in_place(command, "meshtrain launch " + mode);
}

}  // namespace meshtrain
