// launch/: SLURM time limits, shell quoting, hostfile reading, the mesh check against nodes x tasks and the
// sbatch script's parts (tests/e2e/launch.sh runs the script and the launchers).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "meshtrain/launch/hostfile.h"
#include "meshtrain/launch/launch.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Launch, SlurmTimeLimitsInEverySlurmFormat) {
  EXPECT_EQ(slurm_time_seconds("t", "90"), 90 * 60);
  EXPECT_EQ(slurm_time_seconds("t", "5:30"), 5 * 60 + 30);
  EXPECT_EQ(slurm_time_seconds("t", "12:00:00"), 12 * 3600);
  EXPECT_EQ(slurm_time_seconds("t", "2-0"), 2 * 86400);
  EXPECT_EQ(slurm_time_seconds("t", "1-02:03"), 86400 + 2 * 3600 + 3 * 60);
  EXPECT_EQ(slurm_time_seconds("t", "1-02:03:04"), 86400 + 2 * 3600 + 3 * 60 + 4);
  for (const char* bad : {"", "abc", "1:99", "1:2:3:4", "1-24", "1-2:3:4:5", "-5", "1h", "2-", "1:60:00"}) {
    const std::string error = testing::error_of([&] { slurm_time_seconds("meshtrain launch --time", bad); });
    EXPECT_TRUE(contains(error, "meshtrain launch --time")) << bad << ": " << error;
    EXPECT_TRUE(contains(error, "DAYS-HOURS:MINUTES:SECONDS")) << bad << ": " << error;
  }
}

TEST(Launch, ShellQuotingLeavesPlainWordsAndQuotesTheRest) {
  EXPECT_EQ(shell_quoted("run_dir=runs/a-b.c"), "run_dir=runs/a-b.c");
  EXPECT_EQ(shell_quoted(""), "''");
  EXPECT_EQ(shell_quoted("tokenizer_path="), "tokenizer_path=");
  EXPECT_EQ(shell_quoted("a b"), "'a b'");
  EXPECT_EQ(shell_quoted("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quoted("$HOME;rm"), "'$HOME;rm'");
  EXPECT_EQ(shell_line({"sbatch", "my job.sh"}), "sbatch 'my job.sh'");
}

class LaunchFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_launch_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(LaunchFiles, HostfileLinesCommentsAndRepeatedHosts) {
  const std::string path = write(
      "hosts",
      "# the cluster\n\nnode1 slots=4\n  ana@node2 slots=2 max_slots=8 # two GPUs\nnode3\nnode2 slots=1\n");
  const std::vector<HostfileHost> hosts = read_hostfile(path);
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node1");
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "node2");  // the ssh user is not part of the name
  EXPECT_EQ(hosts[1].slots, 3);       // mpirun adds up a host's lines
  EXPECT_EQ(hosts[2].slots, -1);      // not given: mpirun counts the host's cores
}

TEST_F(LaunchFiles, BadHostfilesNameTheLine) {
  const std::string error = testing::error_of([&] { read_hostfile(write("a", "node1\nnode2 slots=0\n")); });
  EXPECT_TRUE(contains(error, "line 2")) << error;
  EXPECT_TRUE(contains(error, "slot count of at least 1")) << error;
  const std::string word = testing::error_of([&] { read_hostfile(write("b", "node1 cores=2\n")); });
  EXPECT_TRUE(contains(word, "'cores=2'")) << word;
  EXPECT_TRUE(contains(testing::error_of([&] { read_hostfile(write("c", "# none\n\n")); }), "no host"));
  EXPECT_TRUE(contains(testing::error_of([&] { read_hostfile((dir_ / "missing").string()); }), "missing"));
  const std::vector<HostfileHost> one = read_hostfile(write("d", "localhost slots=2\n"));
  const std::string hosts = testing::error_of([&] { check_hostfile_hosts("d", one, 2, 1, 22, 1); });
  EXPECT_TRUE(contains(hosts, "2 hosts for --nodes 2")) << hosts;
  const std::string slots = testing::error_of([&] { check_hostfile_hosts("d", one, 1, 3, 22, 1); });
  EXPECT_TRUE(contains(slots, "line 1 host 'localhost'")) << slots;
  EXPECT_TRUE(contains(slots, "slots=2")) << slots;
  EXPECT_EQ(testing::error_of([&] { check_hostfile_hosts("d", one, 1, 2, 22, 1); }), "");  // this machine
}

TEST(Launch, TheMeshMustFitNodesTimesTasks) {
  LaunchRequest request;
  request.config = "qwen3-tiny";
  request.overrides = {"mesh.data=4"};
  request.nodes = 2;
  const std::string error = testing::error_of([&] { check_launch_config(request); });
  EXPECT_TRUE(contains(error, "config key 'mesh'")) << error;
  EXPECT_TRUE(contains(error, "2 nodes x 1 task per node = 2 ranks")) << error;
  EXPECT_TRUE(contains(error, "launch 4 ranks")) << error;
  request.tasks_per_node = 2;
  EXPECT_EQ(testing::error_of([&] { check_launch_config(request); }), "");
}

TEST(Launch, TheScriptRequeuesOnStatus75) {
  LaunchRequest request;
  request.config = "my config.yaml";
  request.overrides = {"steps=10"};
  request.nodes = 3;
  request.tasks_per_node = 2;
  request.binary = "/opt/meshtrain";
  BatchScript script;
  script.job_name = "j";
  script.output_directory = "/runs/a";
  script.working_directory = "/home/u";
  const std::string text = sbatch_script(request, script);
  for (const char* line :
       {"#SBATCH --nodes=3\n", "#SBATCH --ntasks-per-node=2\n", "#SBATCH --signal=B:USR1@120\n",
        "#SBATCH --output=/runs/a/slurm-%j.out\n", "ranks=$((SLURM_JOB_NUM_NODES * 2))\n",
        "launcher=(mpirun -np \"$ranks\" --map-by ppr:2:node --bind-to none)\n",
        "train=(/opt/meshtrain train 'my config.yaml' steps=10)\n", "trap forward_stop USR1 TERM\n",
        "  scontrol requeue \"$SLURM_JOB_ID\"\n", "exit \"$status\"\n"})
    EXPECT_TRUE(contains(text, line)) << line;
  EXPECT_FALSE(contains(text, "#SBATCH --cpus-per-task")) << "SLURM's default unless asked";
  EXPECT_FALSE(contains(text, "#SBATCH --time")) << "the partition's default unless asked";
  request.cpus_per_task = 4;
  script.launcher = Launcher::srun;
  EXPECT_TRUE(
      contains(sbatch_script(request, script),
               "launcher=(srun --mpi=pmix --ntasks=\"$ranks\" --ntasks-per-node=2 --cpus-per-task 4)\n"));
}

}  // namespace
}  // namespace meshtrain
