// Topology catalog: every family's figures, count rules, link classes, the cpu entry's shared host memory,
// user catalogs that add and replace entries, and the errors for bad names and bad files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/topology.h"

namespace meshtrain {
namespace {

constexpr double kGB = 1e9, kGiB = 1024.0 * 1024.0 * 1024.0, kTera = 1e12;

using testing::error_of;

const char* const kFormatHint = "the format is described at the top of configs/topologies.yaml";

// A file under the temp directory, unique to this process (ctest may run tests side by side).
std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (std::to_string(getpid()) + "_" + name)).string();
  std::ofstream(path) << text;
  return path;
}

double machine_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

struct ExpectedFamily {
  std::string name, device_kind;
  int64_t num_devices, devices_per_host;
  double memory_gb, float32_tflops, bfloat16_tflops, memory_bandwidth_gbs, intra_host_gbs, inter_host_gbs;
};

TEST(Topology, EveryFamilyHasItsStatedFigures) {
  const std::vector<ExpectedFamily> families = {
      {"h100x8", "h100", 8, 8, 80, 67, 989, 3350, 450, 50},
      {"h200x16", "h200", 16, 8, 141, 67, 989, 4800, 450, 50},
      {"a100x4", "a100", 4, 8, 80, 19.5, 312, 2039, 300, 25},
      {"b200x64", "b200", 64, 8, 180, 80, 2250, 8000, 900, 50},
      {"mi300xx8", "mi300x", 8, 8, 192, 163.4, 1307.4, 5300, 448, 50},
      {"v5p-8", "v5p", 4, 4, 95, 76.5, 459, 2765, 600, 600},
      {"v6e-16", "v6e", 16, 4, 32, 153, 918, 1638, 400, 400},
      {"v5e-4", "v5e", 4, 4, 16, 32.8, 197, 819, 200, 200},
  };
  for (const ExpectedFamily& expected : families) {
    SCOPED_TRACE(expected.name);
    const Topology topology = load_topology(expected.name);
    EXPECT_EQ(topology.name, expected.name);
    EXPECT_EQ(topology.device_kind, expected.device_kind);
    EXPECT_EQ(topology.num_devices, expected.num_devices);
    EXPECT_EQ(topology.devices_per_host, expected.devices_per_host);
    EXPECT_DOUBLE_EQ(topology.memory_bytes, expected.memory_gb * kGB);
    EXPECT_DOUBLE_EQ(topology.device_memory_bytes(expected.num_devices), expected.memory_gb * kGB);
    EXPECT_DOUBLE_EQ(topology.rates(DType::f32).peak_flops, expected.float32_tflops * kTera);
    EXPECT_DOUBLE_EQ(topology.rates(DType::bf16).peak_flops, expected.bfloat16_tflops * kTera);
    EXPECT_DOUBLE_EQ(topology.memory_bandwidth, expected.memory_bandwidth_gbs * kGB);
    EXPECT_DOUBLE_EQ(topology.intra_host_bandwidth, expected.intra_host_gbs * kGB);
    EXPECT_DOUBLE_EQ(topology.inter_host_bandwidth, expected.inter_host_gbs * kGB);
    EXPECT_FALSE(topology.host_memory_shared);
    EXPECT_EQ(topology.host_cores, 0);
    // No stated attention or softmax rates: attention runs at the tensor-core (MXU) peaks, the softmax is not
    // priced (the cost of every op as before the rates existed).
    EXPECT_DOUBLE_EQ(topology.rates(DType::bf16).matmul_flops, expected.bfloat16_tflops * kTera);
    EXPECT_DOUBLE_EQ(topology.rates(DType::f32).attention_flops, expected.float32_tflops * kTera);
    EXPECT_DOUBLE_EQ(topology.rates(DType::bf16).attention_flops, expected.bfloat16_tflops * kTera);
    EXPECT_EQ(topology.rates(DType::f32).loss_softmax_logits, 0.0);
    EXPECT_EQ(topology.rates(DType::bf16).loss_softmax_logits, 0.0);
    EXPECT_DOUBLE_EQ(topology.rates(DType::bf16).elementwise_bandwidth, expected.memory_bandwidth_gbs * kGB);
  }
}

TEST(Topology, CountsWithinOneHostOrWholeHosts) {
  EXPECT_EQ(load_topology("h100x1").num_devices, 1);
  EXPECT_EQ(load_topology("h100x3").num_devices, 3);
  EXPECT_EQ(load_topology("h100x24").num_devices, 24);
  EXPECT_EQ(load_topology("mi300xx1024").num_devices, 1024);
  EXPECT_EQ(load_topology("v5e-256").num_devices, 256);
}

TEST(Topology, V5pCountsTensorCoresTwoPerChip) {
  EXPECT_EQ(load_topology("v5p-2").num_devices, 1);
  EXPECT_EQ(load_topology("v5p-8").num_devices, 4);
  EXPECT_EQ(load_topology("v5p-16").num_devices, 8);
  EXPECT_EQ(load_topology("v5p-128").num_devices, 64);
}

TEST(Topology, CountOutsideTheRuleSaysWhichCountsAreValid) {
  const std::string partial_hosts = error_of([] { load_topology("h100x12"); });
  EXPECT_NE(partial_hosts.find("config key 'topology'"), std::string::npos) << partial_hosts;
  EXPECT_NE(partial_hosts.find("'h100x12'"), std::string::npos) << partial_hosts;
  EXPECT_NE(partial_hosts.find("N = 1..8 or a multiple of 8"), std::string::npos) << partial_hosts;
  EXPECT_NE(partial_hosts.find("use h100x8 or h100x16"), std::string::npos) << partial_hosts;

  const std::string odd_cores = error_of([] { load_topology("v5p-7"); });
  EXPECT_NE(odd_cores.find("'v5p-7'"), std::string::npos) << odd_cores;
  EXPECT_NE(odd_cores.find("N a multiple of 2"), std::string::npos) << odd_cores;
  EXPECT_NE(odd_cores.find("use v5p-6 or v5p-8"), std::string::npos) << odd_cores;

  // 6 chips: even, but one and a half 4-chip hosts.
  const std::string half_host = error_of([] { load_topology("v5p-12"); });
  EXPECT_NE(half_host.find("use v5p-8 or v5p-16"), std::string::npos) << half_host;

  const std::string zero = error_of([] { load_topology("h100x0"); });
  EXPECT_NE(zero.find("use h100x1"), std::string::npos) << zero;
  EXPECT_NE(error_of([] { load_topology("h100x99999999999999999999"); }).find("too large"),
            std::string::npos);
}

TEST(Topology, UnknownNameListsTheFormsAndTheClosest) {
  const std::string typo = error_of([] { load_topology("h10x8"); });
  EXPECT_NE(typo.find("config key 'topology'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("'h10x8'"), std::string::npos) << typo;
  EXPECT_NE(typo.find("cpu"), std::string::npos) << typo;
  EXPECT_NE(typo.find("h100xN (N = 1..8 or a multiple of 8)"), std::string::npos) << typo;
  EXPECT_NE(typo.find("v5p-N (N a multiple of 2"), std::string::npos) << typo;
  EXPECT_NE(typo.find("did you mean 'h100x8'?"), std::string::npos) << typo;
  EXPECT_NE(typo.find("topologies_path"), std::string::npos) << typo;

  EXPECT_NE(error_of([] { load_topology("mi300x16"); }).find("did you mean 'mi300xx16'?"), std::string::npos);
  EXPECT_NE(error_of([] { load_topology("h100"); }).find("did you mean 'h100x8'?"), std::string::npos);
  EXPECT_NE(error_of([] { load_topology("cpus"); }).find("did you mean 'cpu'?"), std::string::npos);
  EXPECT_THROW(load_topology("h100xN"), MeshError);
  EXPECT_THROW(load_topology("h100x8a"), MeshError);
  EXPECT_THROW(load_topology(""), MeshError);
}

TEST(Topology, NamesListEveryFormInCatalogOrder) {
  const std::vector<std::string> expected = {
      "h100xN (N = 1..8 or a multiple of 8)",
      "h200xN (N = 1..8 or a multiple of 8)",
      "a100xN (N = 1..8 or a multiple of 8)",
      "b200xN (N = 1..8 or a multiple of 8)",
      "mi300xxN (N = 1..8 or a multiple of 8)",
      "v5p-N (N a multiple of 2; N/2 devices = 1..4 or a multiple of 4)",
      "v6e-N (N = 1..4 or a multiple of 4)",
      "v5e-N (N = 1..4 or a multiple of 4)",
      "cpu",
  };
  EXPECT_EQ(topology_names(), expected);
}

TEST(Topology, LinkBandwidthWithinAHostOrBetweenHosts) {
  const Topology h100 = load_topology("h100x64");
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(8, 1), 450 * kGB);  // tensor: one host's 8 GPUs over NVLink
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(8, 8), 50 * kGB);   // data over 8 hosts: InfiniBand
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(2, 4), 450 * kGB);  // spans 8 devices: still one host
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(4, 4), 50 * kGB);   // spans 16 devices: two hosts
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(3, 1), 50 * kGB);  // groups of 3 tile hosts of 8 unevenly: one crosses
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(64, 1), 50 * kGB);
  EXPECT_DOUBLE_EQ(h100.link_bandwidth(1, 64), 450 * kGB);  // no collective at all

  // A topology that fits in one host never leaves it, whatever the group.
  EXPECT_DOUBLE_EQ(load_topology("h100x6").link_bandwidth(6, 1), 450 * kGB);

  // TPUs: ICI within and between hosts of a slice.
  const Topology v5p = load_topology("v5p-128");
  EXPECT_DOUBLE_EQ(v5p.link_bandwidth(4, 1), 600 * kGB);
  EXPECT_DOUBLE_EQ(v5p.link_bandwidth(16, 4), 600 * kGB);
}

TEST(Topology, CpuRanksShareThisMachinesMemory) {
  const Topology cpu = load_topology("cpu");
  EXPECT_EQ(cpu.device_kind, "cpu");
  EXPECT_EQ(cpu.num_devices, 0);
  EXPECT_EQ(cpu.devices_per_host, 0);  // every rank on this one host
  EXPECT_TRUE(cpu.host_memory_shared);
  EXPECT_DOUBLE_EQ(cpu.memory_bytes, machine_memory_bytes());
  EXPECT_DOUBLE_EQ(cpu.device_memory_bytes(1), machine_memory_bytes());
  EXPECT_DOUBLE_EQ(cpu.device_memory_bytes(2), machine_memory_bytes() / 2);
  EXPECT_DOUBLE_EQ(cpu.device_memory_bytes(8), machine_memory_bytes() / 8);
  EXPECT_GE(cpu.host_cores, 1);
  EXPECT_LE(cpu.host_cores, static_cast<int64_t>(std::thread::hardware_concurrency()));
  EXPECT_DOUBLE_EQ(cpu.rates(DType::f32).peak_flops, 0.230 * kTera);
  EXPECT_DOUBLE_EQ(cpu.rates(DType::bf16).peak_flops, 0.460 * kTera);
  EXPECT_DOUBLE_EQ(cpu.memory_bandwidth, 50 * kGB);
  EXPECT_DOUBLE_EQ(cpu.link_bandwidth(2, 1), 20 * kGB);
  EXPECT_DOUBLE_EQ(cpu.link_bandwidth(4, 16), 20 * kGB);
}

const char* const kUserCatalog = R"(
mygpuxN:
  device_kind: mygpu
  devices_per_host: 4
  memory_gib: 24
  peak_tflops: {float32: 10, bfloat16: 100}
  memory_bandwidth_gbs: 1000
  intra_host_link_gbs: 64
  inter_host_link_gbs: 12.5
cpu:                       # replaces the built-in cpu: a stated 64 GiB, 16-core host
  device_kind: cpu
  num_devices: 0
  host_memory_shared: true
  memory_gib: 64
  host_cores: 16
  peak_tflops: {float32: 2, bfloat16: 4}
  memory_bandwidth_gbs: 200
  intra_host_link_gbs: 40
lab:                       # a fixed cluster: 4 hosts of 4 CPUs sharing each host's memory
  device_kind: cpu
  num_devices: 16
  devices_per_host: 4
  host_memory_shared: true
  memory_gb: 128
  peak_tflops: {float32: 1, bfloat16: 2}
  matmul_tflops: {float32: 0.75, bfloat16: 1.5}
  attention_tflops: {float32: 0.25, bfloat16: 0.5}
  loss_softmax_glogits: {float32: 3, bfloat16: 1.5}
  elementwise_gbs: {float32: 20, bfloat16: 25}
  memory_bandwidth_gbs: 100
  intra_host_link_gbs: 30
  inter_host_link_gbs: 3
)";

TEST(Topology, UserCatalogAddsAndReplacesEntries) {
  const std::string path = write_temp("user_topologies.yaml", kUserCatalog);

  const Topology added = load_topology("mygpux8", path);
  EXPECT_EQ(added.device_kind, "mygpu");
  EXPECT_EQ(added.num_devices, 8);
  EXPECT_DOUBLE_EQ(added.memory_bytes, 24 * kGiB);
  EXPECT_DOUBLE_EQ(added.rates(DType::bf16).peak_flops, 100 * kTera);
  EXPECT_DOUBLE_EQ(added.link_bandwidth(4, 1), 64 * kGB);
  EXPECT_DOUBLE_EQ(added.link_bandwidth(2, 4), 12.5 * kGB);
  EXPECT_NE(error_of([&] { load_topology("mygpux6", path); }).find("use mygpux4 or mygpux8"),
            std::string::npos);

  const Topology replaced = load_topology("cpu", path);
  EXPECT_DOUBLE_EQ(replaced.memory_bytes, 64 * kGiB);
  EXPECT_DOUBLE_EQ(replaced.device_memory_bytes(4), 16 * kGiB);
  EXPECT_EQ(replaced.host_cores, 16);
  EXPECT_DOUBLE_EQ(replaced.rates(DType::f32).peak_flops, 2 * kTera);

  const Topology lab = load_topology("lab", path);
  EXPECT_EQ(lab.num_devices, 16);
  EXPECT_DOUBLE_EQ(lab.device_memory_bytes(16), 32 * kGB);  // 4 ranks on each 128 GB host
  EXPECT_DOUBLE_EQ(lab.link_bandwidth(4, 4), 3 * kGB);
  EXPECT_DOUBLE_EQ(lab.rates(DType::f32).matmul_flops, 0.75 * kTera);
  EXPECT_DOUBLE_EQ(lab.rates(DType::bf16).matmul_flops, 1.5 * kTera);
  EXPECT_DOUBLE_EQ(lab.rates(DType::f32).attention_flops, 0.25 * kTera);
  EXPECT_DOUBLE_EQ(lab.rates(DType::bf16).attention_flops, 0.5 * kTera);
  EXPECT_DOUBLE_EQ(lab.rates(DType::f32).loss_softmax_logits, 3 * kGB);
  EXPECT_DOUBLE_EQ(lab.rates(DType::bf16).loss_softmax_logits, 1.5 * kGB);
  EXPECT_DOUBLE_EQ(lab.rates(DType::f32).elementwise_bandwidth, 20 * kGB);
  EXPECT_DOUBLE_EQ(lab.rates(DType::bf16).elementwise_bandwidth, 25 * kGB);
  // An entry without them (written before they existed) loads with matmuls and attention at its GEMM peaks.
  EXPECT_DOUBLE_EQ(replaced.rates(DType::f32).matmul_flops, 2 * kTera);
  EXPECT_DOUBLE_EQ(replaced.rates(DType::bf16).attention_flops, 4 * kTera);
  EXPECT_EQ(replaced.rates(DType::bf16).loss_softmax_logits, 0.0);
  EXPECT_DOUBLE_EQ(replaced.rates(DType::f32).elementwise_bandwidth, 200 * kGB);  // its memory_bandwidth_gbs

  EXPECT_EQ(load_topology("h100x8", path).num_devices, 8);  // the built-in ones remain
  const std::vector<std::string> names = topology_names(path);
  EXPECT_NE(std::find(names.begin(), names.end(), "mygpuxN (N = 1..4 or a multiple of 4)"), names.end());
  EXPECT_EQ(std::count(names.begin(), names.end(), "cpu"), 1);
  EXPECT_EQ(names.size(), 11u);

  // Without the user file the added names are unknown.
  EXPECT_THROW(load_topology("mygpux8"), MeshError);
  std::filesystem::remove(path);
}

// The error `load_topology` gives for a user file with `text`, which must name the file and contain `words`.
void expect_user_file_error(const std::string& file_name, const std::string& text,
                            const std::vector<std::string>& words) {
  SCOPED_TRACE(file_name);
  const std::string path = write_temp(file_name, text);
  EXPECT_THROW(load_topology("h100x8", path), MeshError);
  const std::string message = error_of([&] { load_topology("h100x8", path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  for (const std::string& word : words) EXPECT_NE(message.find(word), std::string::npos) << message;
  std::filesystem::remove(path);
}

const char* const kGoodFields = R"(
  device_kind: x
  devices_per_host: 4
  peak_tflops: {float32: 1, bfloat16: 2}
  intra_host_link_gbs: 10
  inter_host_link_gbs: 1
)";

TEST(Topology, BadUserFilesNameTheFileAndTheField) {
  const std::string missing_file = "/nonexistent/topologies.yaml";
  const std::string unreadable = error_of([&] { load_topology("h100x8", missing_file); });
  EXPECT_NE(unreadable.find(missing_file), std::string::npos) << unreadable;
  EXPECT_NE(unreadable.find("no readable file"), std::string::npos) << unreadable;
  EXPECT_NE(unreadable.find("topologies_path"), std::string::npos) << unreadable;

  expect_user_file_error("missing_field.yaml",
                         std::string("bad:\n  num_devices: 8\n  memory_gb: 8\n") + kGoodFields,
                         {"topology 'bad'", "field 'memory_bandwidth_gbs'", "missing"});
  expect_user_file_error("bad_number.yaml",
                         "bad:\n  device_kind: x\n  num_devices: 8\n  devices_per_host: 8\n  memory_gb: 8\n"
                         "  peak_tflops: {float32: fast, bfloat16: 2}\n  memory_bandwidth_gbs: 1\n"
                         "  intra_host_link_gbs: 1\n",
                         {"field 'peak_tflops.float32'", "a positive number", "'fast'"});
  expect_user_file_error("negative.yaml",
                         std::string("badxN:\n  memory_gb: -3\n  memory_bandwidth_gbs: 1\n") + kGoodFields,
                         {"topology 'badxN'", "field 'memory_gb'", "'-3'"});
  expect_user_file_error(
      "typo.yaml", std::string("badxN:\n  memory_gb: 8\n  memory_bandwith_gbs: 1\n") + kGoodFields,
      {"field 'memory_bandwith_gbs'", "unknown field", "did you mean 'memory_bandwidth_gbs'?"});
  expect_user_file_error(
      "both_units.yaml",
      std::string("badxN:\n  memory_gb: 8\n  memory_gib: 8\n  memory_bandwidth_gbs: 1\n") + kGoodFields,
      {"memory_gb' or 'memory_gib'", "both"});
  expect_user_file_error(
      "count_in_family.yaml",
      std::string("badxN:\n  num_devices: 4\n  memory_gb: 8\n  memory_bandwidth_gbs: 1\n") + kGoodFields,
      {"field 'num_devices'", "no num_devices in a family"});
  expect_user_file_error("fractional.yaml",
                         "badxN:\n  device_kind: x\n  devices_per_host: 2.5\n  memory_gb: 8\n"
                         "  peak_tflops: {float32: 1, bfloat16: 2}\n  memory_bandwidth_gbs: 1\n"
                         "  intra_host_link_gbs: 1\n  inter_host_link_gbs: 1\n",
                         {"field 'devices_per_host'", "a whole number", "'2.5'"});
  const std::string rates_entry =
      std::string("badxN:\n  memory_gb: 8\n  memory_bandwidth_gbs: 1\n") + kGoodFields;
  expect_user_file_error("negative_rate.yaml",
                         rates_entry + "  attention_tflops: {float32: -0.5, bfloat16: 1}\n",
                         {"topology 'badxN'", "field 'attention_tflops.float32'",
                          "float32 attention TFLOP/s per device: a positive number", "'-0.5'", kFormatHint});
  expect_user_file_error("word_rate.yaml",
                         rates_entry + "  loss_softmax_glogits: {float32: 2, bfloat16: fast}\n",
                         {"field 'loss_softmax_glogits.bfloat16'", "a positive number", "'fast'"});
  expect_user_file_error("negative_matmul.yaml",
                         rates_entry + "  matmul_tflops: {float32: 1, bfloat16: -2}\n",
                         {"field 'matmul_tflops.bfloat16'", "a positive number", "'-2'"});
  expect_user_file_error("zero_rate.yaml", rates_entry + "  elementwise_gbs: {float32: 0, bfloat16: 1}\n",
                         {"field 'elementwise_gbs.float32'", "a positive number", "'0'"});
  expect_user_file_error("one_dtype.yaml", rates_entry + "  attention_tflops: {float32: 1}\n",
                         {"field 'attention_tflops.bfloat16'", "a positive number", "missing"});
  expect_user_file_error("scalar_rate.yaml", rates_entry + "  attention_tflops: 1\n",
                         {"field 'attention_tflops'", "{float32: <number>, bfloat16: <number>}", "'1'"});
  expect_user_file_error("dtype_typo.yaml", rates_entry + "  attention_tflops: {float32: 1, bfloat: 2}\n",
                         {"field 'attention_tflops', field 'bfloat'", "did you mean 'bfloat16'?"});
  expect_user_file_error("not_yaml.yaml", "bad: [unclosed\n", {"invalid YAML"});
  expect_user_file_error("a_list.yaml", "- h100x8\n", {"a map from topology names", "a list"});
  expect_user_file_error("twice.yaml",
                         std::string("badxN:\n  memory_gb: 8\n  memory_bandwidth_gbs: 1\n") + kGoodFields +
                             "badxN:\n  memory_gb: 8\n  memory_bandwidth_gbs: 1\n" + kGoodFields,
                         {"each topology name once", "'badxN' twice"});
}

}  // namespace
}  // namespace meshtrain
