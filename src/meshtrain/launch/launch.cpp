// meshtrain launch's pieces (launch.h): the mesh check, the srun / mpirun command lines and the sbatch
// script.
#include "meshtrain/launch/launch.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/mesh/mesh.h"
#include "meshtrain/plan/topology.h"

extern char** environ;

namespace meshtrain {
namespace {

std::string plural(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// "--map-by ppr:T:node --bind-to none": T ranks on each host. Without --cpus-per-task a rank's threads may
// run on any core of its host (the engine starts cores / ranks-on-host threads), so binding a rank to the
// one core Open MPI would pick would squeeze its threads onto it; with C cores per task, PE=C binds each rank
// to its own C cores, as SLURM gave them.
std::vector<std::string> mpirun_mapping(const LaunchRequest& request) {
  const std::string ppr = "ppr:" + std::to_string(request.tasks_per_node) + ":node";
  if (request.cpus_per_task > 0)
    return {"--map-by", ppr + ":PE=" + std::to_string(request.cpus_per_task), "--bind-to", "core"};
  return {"--map-by", ppr, "--bind-to", "none"};
}

void append(std::vector<std::string>& words, const std::vector<std::string>& more) {
  words.insert(words.end(), more.begin(), more.end());
}

// A number of one field of a SLURM time; -1 when it is not one.
int64_t time_field(const std::string& text) {
  int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) return -1;
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == separator) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

}  // namespace

Config check_launch_config(const LaunchRequest& request) {
  Config config = load_config(request.config, request.overrides);
  load_topology(config.topology, config.topologies_path);  // a topology train would refuse is refused here
  const std::string ranks = plural(request.nodes, "node") + " x " + plural(request.tasks_per_node, "task") +
                            " per node = " + plural(request.ranks(), "rank");
  try {
    resolve_mesh(config.mesh, request.ranks(), ranks);
  } catch (const MeshError& error) {
    int64_t fixed = 1;  // the product of the mesh's fixed axes
    bool filled = false;
    for (MeshAxis axis : kMeshAxes) {
      const int64_t size = config.mesh[axis];
      filled = filled || size == -1;
      fixed *= size > 0 ? size : 1;
    }
    const ErrorContext& context = error.context();
    fail(context.where, context.expected, context.found,
         context.hint + "; or launch " + (filled ? "a multiple of " : "") + plural(fixed, "rank") +
             " (--nodes x --tasks-per-node)");
  }
  return config;
}

std::vector<std::string> train_command(const LaunchRequest& request) {
  std::vector<std::string> words = {request.binary, "train", request.config};
  append(words, request.overrides);
  return words;
}

std::vector<std::string> srun_command(const LaunchRequest& request) {
  std::vector<std::string> words = {"srun",
                                    "--mpi=pmix",
                                    "-N",
                                    std::to_string(request.nodes),
                                    "--ntasks-per-node",
                                    std::to_string(request.tasks_per_node)};
  if (request.cpus_per_task > 0) append(words, {"--cpus-per-task", std::to_string(request.cpus_per_task)});
  append(words, request.launcher_extra);
  append(words, train_command(request));
  return words;
}

std::vector<std::string> mpirun_hostfile_command(const LaunchRequest& request, const std::string& hostfile) {
  std::vector<std::string> words = {"mpirun", "--hostfile", hostfile, "-np", std::to_string(request.ranks())};
  append(words, mpirun_mapping(request));
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable(*entry);
    const std::string name = variable.substr(0, variable.find('='));
    if (name.starts_with("MESHTRAIN_") || name.starts_with("OMP_")) append(words, {"-x", name});
  }
  append(words, request.launcher_extra);
  append(words, train_command(request));
  return words;
}

std::string shell_quoted(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_./=:,+@%-") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string shell_line(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& word : words) line += (line.empty() ? "" : " ") + shell_quoted(word);
  return line;
}

int64_t slurm_time_seconds(const std::string& where, const std::string& text) {
  const auto refuse = [&]() -> int64_t {
    fail(
        where,
        "a SLURM time limit: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES "
        "or DAYS-HOURS:MINUTES:SECONDS (minutes and seconds below 60, hours below 24 after a day count)",
        "'" + text + "'", "e.g. --time 90 (minutes), --time 12:00:00 or --time 2-00:00:00");
  };
  const size_t dash = text.find('-');
  int64_t days = 0;
  std::string clock = text;
  if (dash != std::string::npos) {
    days = time_field(text.substr(0, dash));
    clock = text.substr(dash + 1);
    if (days < 0) return refuse();
  }
  std::vector<int64_t> fields;
  for (const std::string& part : split(clock, ':')) {
    fields.push_back(time_field(part));
    if (fields.back() < 0) return refuse();
  }
  int64_t seconds = 0;
  if (dash != std::string::npos) {  // days-hours[:minutes[:seconds]]
    if (fields.size() > 3 || fields[0] >= 24) return refuse();
    const int64_t units[] = {3600, 60, 1};
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0 && fields[i] >= 60) return refuse();
      seconds += fields[i] * units[i];
    }
    return days * 86400 + seconds;
  }
  if (fields.size() == 1) return fields[0] * 60;                                // minutes
  if (fields.size() == 2 && fields[1] < 60) return fields[0] * 60 + fields[1];  // minutes:seconds
  if (fields.size() == 3 && fields[1] < 60 && fields[2] < 60)                   // hours:minutes:seconds
    return fields[0] * 3600 + fields[1] * 60 + fields[2];
  return refuse();
}

std::string sbatch_script(const LaunchRequest& request, const BatchScript& script) {
  const bool srun = script.launcher == Launcher::srun;
  const std::string S = std::to_string(script.signal_seconds);
  std::string text = "#!/bin/bash\n";
  text +=
      "# Written by `meshtrain launch`: " + shell_line({request.config}) + " on " +
      plural(request.nodes, "node") + " x " + plural(request.tasks_per_node, "task") +
      " per node. Submit it with `sbatch THIS_FILE`.\n"
      "#\n"
      "# - #SBATCH: the allocation (nodes, tasks = MPI ranks per node, cores per task, time limit).\n"
      "#   --signal=B:USR1@" +
      S + ": SLURM sends SIGUSR1 to this batch shell " + S +
      " s before the time limit.\n"
      "#   --requeue lets the job be requeued; --open-mode=append keeps every run of the job in one\n"
      "#   slurm-<job id>.out in the run directory.\n"
      "# - The launcher (" +
      (srun ? "srun" : "mpirun") +
      ") starts `meshtrain train` on every rank, in the "
      "background so that this shell\n"
      "#   can take signals while it runs.\n"
      "# - The trap turns SIGUSR1 (the time limit is near) and SIGTERM (scancel, preemption) into SIGUSR1 "
      "to\n"
      "#   the launcher, which passes it on to every rank (" +
      (srun ? "srun forwards signals to its tasks" : "mpirun forwards SIGUSR1 to its ranks") +
      "). Each rank\n"
      "#   saves a checkpoint at the next step boundary and exits. SIGUSR1 and not SIGTERM: Open MPI's "
      "mpirun\n"
      "#   kills its ranks a few seconds after it forwards SIGTERM, which a large save does not fit in.\n"
      "# - Exit status 75 from meshtrain train means \"checkpoint committed, requeue me\": the script asks\n"
      "#   SLURM to requeue the job (scontrol requeue), and the requeued job resumes from that checkpoint.\n"
      "#   Any other status ends the job with that status.\n";
  text += "#SBATCH --job-name=" + script.job_name + "\n";
  text += "#SBATCH --nodes=" + std::to_string(request.nodes) + "\n";
  text += "#SBATCH --ntasks-per-node=" + std::to_string(request.tasks_per_node) + "\n";
  if (request.cpus_per_task > 0)
    text += "#SBATCH --cpus-per-task=" + std::to_string(request.cpus_per_task) + "\n";
  if (!script.time_limit.empty()) text += "#SBATCH --time=" + script.time_limit + "\n";
  text += "#SBATCH --signal=B:USR1@" + S + "\n";
  text += "#SBATCH --requeue\n";
  text += "#SBATCH --open-mode=append\n";
  text += "#SBATCH --output=" + script.output_directory + "/slurm-%j.out\n";
  text += "#SBATCH --chdir=" + script.working_directory + "\n";
  text += "set -u\n\n";
  const std::string T = std::to_string(request.tasks_per_node);
  text +=
      "# T ranks on every node the job holds now: a job requeued onto fewer nodes (after a node was lost)\n"
      "# still sees SLURM_NTASKS of its first allocation.\n"
      "ranks=$((SLURM_JOB_NUM_NODES * " +
      T + "))\n";
  if (srun) {
    std::vector<std::string> launcher = {"--ntasks-per-node=" + T};
    // Since SLURM 22.05 srun no longer reads the job's --cpus-per-task: it is given again.
    if (request.cpus_per_task > 0)
      append(launcher, {"--cpus-per-task", std::to_string(request.cpus_per_task)});
    append(launcher, request.launcher_extra);
    text += "launcher=(srun --mpi=pmix --ntasks=\"$ranks\" " + shell_line(launcher) + ")\n";
  } else {
    text +=
        "# mpirun reads the allocation from SLURM. --bind-to none without --cpus-per-task: each rank runs\n"
        "# threads on the cores of its node (binding it to one core would squeeze them onto that core); "
        "with\n"
        "# it, PE=C binds each rank to its own C cores.\n";
    std::vector<std::string> launcher = mpirun_mapping(request);
    append(launcher, request.launcher_extra);
    text += "launcher=(mpirun -np \"$ranks\" " + shell_line(launcher) + ")\n";
  }
  text += "train=(" + shell_line(train_command(request)) + ")\n\n";
  text +=
      "# A stop request that comes before the launcher has started is passed on as soon as it has.\n"
      "launcher_pid=\"\"\n"
      "stop_requests=0\n"
      "forward_stop() {\n"
      "  stop_requests=$((stop_requests + 1))\n"
      "  if [ -n \"$launcher_pid\" ]; then kill -USR1 \"$launcher_pid\" 2>/dev/null; fi\n"
      "}\n"
      "trap forward_stop USR1 TERM\n\n"
      "echo \"meshtrain launch: job ${SLURM_JOB_ID:-?}: ${launcher[*]} ${train[*]}\"\n"
      "\"${launcher[@]}\" \"${train[@]}\" &\n"
      "launcher_pid=$!\n"
      "if [ \"$stop_requests\" -gt 0 ]; then kill -USR1 \"$launcher_pid\" 2>/dev/null; fi\n\n"
      "# bash's wait returns as soon as a trapped signal arrives (status > 128) while the launcher still "
      "runs:\n"
      "# wait again until it has exited. Each extra round takes another signal; 1000 rounds at most.\n"
      "status=0\n"
      "for ((round = 0; round < 1000; round++)); do\n"
      "  requests_before=$stop_requests\n"
      "  wait \"$launcher_pid\"\n"
      "  result=$?\n"
      "  # 127: the launcher's status was already collected (it ended just as a signal came in).\n"
      "  if [ \"$round\" -gt 0 ] && [ \"$result\" -eq 127 ]; then break; fi\n"
      "  status=$result\n"
      "  if [ \"$stop_requests\" -eq \"$requests_before\" ] || [ \"$status\" -le 128 ]; then break; fi\n"
      "done\n\n"
      "if [ \"$status\" -eq " +
      std::to_string(kRequeueExitStatus) +
      " ]; then\n"
      "  echo \"meshtrain launch: checkpoint committed (exit status " +
      std::to_string(kRequeueExitStatus) +
      "): requeueing job $SLURM_JOB_ID\"\n"
      "  scontrol requeue \"$SLURM_JOB_ID\"\n"
      "fi\n"
      "exit \"$status\"\n";
  return text;
}

void run_in_place(const std::vector<std::string>& command, const std::string& where) {
  std::fflush(stdout);
  std::vector<char*> arguments;
  for (const std::string& word : command) arguments.push_back(const_cast<char*>(word.c_str()));
  arguments.push_back(nullptr);
  ::execvp(arguments[0], arguments.data());
  const int err = errno;
  fail(where, "'" + command[0] + "' on PATH", std::string("exec failed: ") + std::strerror(err),
       err == ENOENT
           ? "install it (Debian: " + std::string(command[0] == "srun" ? "slurm-client" : "openmpi-bin") +
                 ") or put its folder on PATH"
           : "check that it is executable");
}

}  // namespace meshtrain
