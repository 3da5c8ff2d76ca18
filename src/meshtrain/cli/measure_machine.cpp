// `meshtrain measure-machine`: times this machine's GEMM peaks, the rates of attention, the loss's softmax
// and the elementwise ops in a training step, and the memory bandwidth, and writes them as a topology entry
// (the built-in `cpu` entry with the measured figures) to plan this machine with.
#include "meshtrain/cli/measure_machine.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/topology.h"
#include "meshtrain/train/machine.h"

namespace meshtrain {
namespace {

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &parts);
  return text;
}

// A fixed catalog name: letters, digits, '-' and '_', not ending in 'N' (that would make it a family).
void check_entry_name(const std::string& name) {
  bool valid = !name.empty() && name.back() != 'N';
  for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  if (!valid) {
    fail("meshtrain measure-machine --name",
         "a topology name of letters, digits, '-' and '_' that does not end in 'N' (a family's mark)",
         "'" + name + "'", "e.g. --name cpu (replaces the built-in entry) or --name my-epyc");
  }
}

// The entry: the built-in `cpu` entry with this machine's measured peaks, op class rates (float32, bf16)
// and memory bandwidth.
std::string catalog_text(const std::string& name, const Topology& stated, const MachineReport& machine,
                         const OpClassRates& float32_rates, const OpClassRates& bf16_rates,
                         double bandwidth) {
  const std::string peak = fixed(machine.gemm_peak_flops / 1e12, 4);
  std::string text;
  text += "# Written by `meshtrain measure-machine` on " + utc_now() + ".\n";
  text += "# " + machine.cpu + "\n# matmuls: " + machine.gemm + ", " + std::to_string(machine.threads) +
          " thread(s)\n";
  text += "# float32 GEMM peak " + fixed(machine.gemm_peak_flops / 1e9, 1) + " GFLOP/s (" +
          machine.peak_source + "); memory " + fixed(bandwidth / 1e9, 1) +
          " GB/s, the best measured on this machine (bytes read + written, as the plan counts them).\n";
  const bool bf16_measured = machine.gemm_bf16_peak_flops > 0.0;
  if (bf16_measured) {
    text += "# bfloat16 GEMM peak (bf16 inputs, float32 accumulation) " +
            fixed(machine.gemm_bf16_peak_flops / 1e9, 1) +
            " GFLOP/s measured; the link is the built-in entry's stated figure.\n";
  } else {
    text +=
        "# bfloat16 peak (this CPU has no bf16 instructions) and the link are the built-in entry's stated "
        "figures (not measured here).\n";
  }
  text +=
      "# Matmuls, attention, the loss's softmax (its time beside its GEMMs at the matmul rate, per logit and "
      "GEMM pass) and the elementwise ops' bytes timed in a training step of one gpt2-124m layer at 4 x 256, "
      "vocabulary 8192 (each the best measured on this machine)" +
      std::string(bf16_measured ? "" : "; bfloat16: the float32 figures") + ".\n";
  text += "# Use: meshtrain compile MODEL topologies_path=THIS_FILE" +
          (name == stated.name ? std::string() : " topology=" + name) +
          (name == stated.name ? "  (this entry replaces the built-in '" + stated.name + "')" : "") + "\n";
  text += name + ":\n";
  text += "  device_kind: " + stated.device_kind + "\n";
  text += "  num_devices: 0\n";
  text += std::string("  host_memory_shared: ") + (stated.host_memory_shared ? "true" : "false") + "\n";
  text += "  memory_gb: this_machine\n";
  text += "  host_cores: this_machine\n";
  const double bf16_peak = bf16_measured ? machine.gemm_bf16_peak_flops : stated.bfloat16.peak_flops;
  text += "  peak_tflops: {float32: " + peak + ", bfloat16: " + fixed(bf16_peak / 1e12, 4) + "}\n";
  text += "  matmul_tflops: {float32: " + fixed(float32_rates.matmul_flops / 1e12, 4) +
          ", bfloat16: " + fixed(bf16_rates.matmul_flops / 1e12, 4) + "}\n";
  text += "  attention_tflops: {float32: " + fixed(float32_rates.attention_flops / 1e12, 4) +
          ", bfloat16: " + fixed(bf16_rates.attention_flops / 1e12, 4) + "}\n";
  text += "  loss_softmax_glogits: {float32: " + fixed(float32_rates.loss_softmax_logits / 1e9, 3) +
          ", bfloat16: " + fixed(bf16_rates.loss_softmax_logits / 1e9, 3) + "}\n";
  text += "  memory_bandwidth_gbs: " + fixed(bandwidth / 1e9, 2) + "\n";
  text += "  elementwise_gbs: {float32: " + fixed(float32_rates.elementwise_bandwidth / 1e9, 3) +
          ", bfloat16: " + fixed(bf16_rates.elementwise_bandwidth / 1e9, 3) + "}\n";
  text += "  intra_host_link_gbs: " + fixed(stated.intra_host_bandwidth / 1e9, 2) + "\n";
  return text;
}

}  // namespace

int run_measure_machine(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("measure-machine"), arguments);
  const std::string name = parsed.value("--name") ? *parsed.value("--name") : "cpu";
  check_entry_name(name);
  const std::string* out_path = parsed.value("--out");
  if (out_path) {  // checked before the measurement, which takes a second
    const std::filesystem::path parent = std::filesystem::path(*out_path).parent_path();
    if (out_path->empty() || (!parent.empty() && !std::filesystem::is_directory(parent))) {
      fail("meshtrain measure-machine --out", "a file path in an existing folder", "'" + *out_path + "'",
           "create the folder first, or name a file in the current one");
    }
  }
  const Topology stated = load_topology("cpu");
  const bool with_bf16 = cpu_features().avx512_bf16 || cpu_features().amx_bf16;
  const MachineReport machine = measure_machine(with_bf16, PeakTiming::full);
  const OpClassRates float32_rates = measure_op_class_rates(DType::f32);
  const OpClassRates bf16_rates = with_bf16 ? measure_op_class_rates(DType::bf16) : float32_rates;
  const double bandwidth = measure_memory_bandwidth();
  const std::string text = catalog_text(name, stated, machine, float32_rates, bf16_rates, bandwidth);
  if (!out_path) {
    out << text;
    return 0;
  }
  const std::string& path = *out_path;
  write_file_atomically(path, text);
  out << "measure-machine: float32 GEMM peak " << fixed(machine.gemm_peak_flops / 1e9, 1) << " GFLOP/s ("
      << machine.threads << " threads), matmuls " << fixed(float32_rates.matmul_flops / 1e9, 1) << " / "
      << fixed(bf16_rates.matmul_flops / 1e9, 1) << " GFLOP/s float32 / bfloat16, attention "
      << fixed(float32_rates.attention_flops / 1e9, 1) << " / " << fixed(bf16_rates.attention_flops / 1e9, 1)
      << ", memory " << fixed(bandwidth / 1e9, 1) << " GB/s; wrote topology '" << name << "' to " << path
      << "\n  plan this machine: meshtrain compile MODEL topologies_path=" << path
      << (name == stated.name ? "" : " topology=" + name) << "\n";
  return 0;
}

}  // namespace meshtrain
