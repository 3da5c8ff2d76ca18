// The machine a run is on, as the run reports it: the CPU's features, the GEMM backend and its instruction
// set, the threads, and the float32 GEMM peak that `mfu` is measured against. Printed at start and written
// to run_dir/machine.json, so every figure says which CPU and which matmul code produced it. Beside it, what
// `meshtrain measure-machine` writes into a topology: the rates of the op kinds that do not run at the GEMM
// peak, and the memory bandwidth.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

struct MachineReport {
  std::string cpu;               // CpuFeatures::describe()
  std::string gemm;              // GemmBackend::describe()
  std::string gemm_warning;      // non-empty when matmuls run slower than this CPU allows
  int threads = 1;               // OpenMP threads of this process
  double gemm_peak_flops = 0.0;  // float32 GEMM FLOP/s on `threads` threads, best measured on this machine
  double gemm_bf16_peak_flops = 0.0;  // the same with bfloat16 inputs (0: not measured)
  std::string peak_source;       // "measured now" or the cache file that held a higher earlier measurement
  int peak_calls = 0;            // the GEMM calls timed for the float32 peak now (the best of them counts)
  std::string describe() const;  // one line for the console
  nlohmann::json to_json() const;
};

// How long measure_machine times the GEMM: `full` always takes the best of 40 calls (measure-machine);
// `brief_when_cached` takes the best of 5 where this machine already has a figure cached (a run's start).
enum class PeakTiming { full, brief_when_cached };

// Measures a square float32 GEMM (n = 1024, best of 40 calls: 0.2 s on the 2-core AMX Xeon, 1 s on a 2-core
// Zen 1) on the current OpenMP thread count, and with with_bf16 the same GEMM with bfloat16 inputs. The best
// figure ever measured for this CPU, backend and thread count is kept in $XDG_CACHE_HOME/meshtrain (or
// ~/.cache/meshtrain): a measurement disturbed by other processes can only lower a figure, so the highest one
// is the machine's. Nothing is cached when that folder is not writable.
MachineReport measure_machine(bool with_bf16, PeakTiming timing);

// What the plan prices apart from the GEMM peak (plan/topology.h), measured for one compute dtype.
struct OpClassRates {
  double matmul_flops = 0.0;           // FLOP/s of the dense matmuls (the layers' and the loss's GEMMs)
  double attention_flops = 0.0;        // FLOP/s of the attention ops (forward and backward together)
  double loss_softmax_logits = 0.0;    // logits/s (per GEMM pass) of the cross-entropy beside its GEMMs
  double elementwise_bandwidth = 0.0;  // bytes/s the elementwise ops move (the plan's bytes accessed)
};

// Times a training step's ops (fwd_bwd, the best of two steps per op) of a one-layer gpt2-124m at 4 x 256
// with an 8,192-row vocabulary (the whole one takes seconds more) in `dtype`, through the engine: the kernels
// a run in that dtype calls, at gpt2-124m's layer shapes (activations beyond the L2 cache, as a model's are).
// Matmuls and attention: the plan's FLOPs of those ops over their time; the loss: its time less its GEMMs at
// the matmul rate, over its logit passes; elementwise ops: their planned bytes over their time. As the peaks,
// each rate is the best measured on this machine (cached beside them). 1-3 s on 2 shared cores.
OpClassRates measure_op_class_rates(DType dtype);

// Memory bandwidth as the plan counts it (bytes read + bytes written, the plan's `bytes accessed`): best of a
// few passes of dst = src x scale over two 128 MiB float32 arrays, on the current OpenMP thread count; as
// the peaks, the best figure measured on this machine (cached beside them).
double measure_memory_bandwidth();

}  // namespace meshtrain
