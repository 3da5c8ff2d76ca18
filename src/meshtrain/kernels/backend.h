// The backend seam: one table of kernel entry points per backend (`cpu`, and `cuda` where built). Model ops
// call kernels only through the table their OpContext carries, and the spec builder sizes kernel scratch with
// the table's queries, so a new backend is a new folder beside kernels/cpu/ that fills the same table, not
// edits throughout the model and engine.
//
// A backend plugs in as kernels/<name>/backend.cpp defining `const KernelBackend& <name>_backend()`, plus one
// case in kernel_backend_for_device (backend.cpp). Every pointer argument points into the arena the engine
// hands the op: host memory for cpu, device memory for cuda. Semantics (what is written, what accumulates,
// determinism) are those documented in the cpu headers, which every backend must match.
//
// Each kernel's signature is written once, as a function type in signatures.h (`RmsnormForward`): the table
// holds pointers of that type and the cpu and cuda headers declare their functions with it
// (`RmsnormForward rmsnorm_forward;` is an ordinary declaration of a function of that type). Plain types
// rather than one X-macro list that generates the table and the declarations: a reader finds every
// signature, with its argument shapes, as ordinary C++ in one file, and a definition that drifts from its
// type fails the build naming the function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// The device a run would use, as the engine checks it before it allocates anything (check_plan_runs_here):
// its free memory now, the memory a process holds there beside its arena, and whether it computes with
// bf16 inputs. The host reports free_bytes 0: its memory is the topology's stated size, checked by the plan.
struct DeviceResources {
  std::string name;           // the device in words, with what the checks name ("NVIDIA H200, sm_90")
  size_t free_bytes = 0;      // free on the device now; 0 = not checked
  size_t overhead_bytes = 0;  // held beside the arena once the kernels run (modules, library workspaces)
  bool bf16 = true;           // runs bf16 GEMM inputs (CUDA: compute capability 8.0 or later)
};

struct KernelBackend {
  const char* name;  // "cpu", "cuda"

  // The device and its memory. device_check: why this process cannot run the backend's kernels ("" when it
  // can: cpu always; cuda when built with CUDA and a GPU is visible). device_description: the device in
  // words with its memory, for logs and errors. The arena the engine hands every op lives in
  // memory_allocate's memory (zeroed; nullptr when it does not fit). memory_on_host: the engine and ops may
  // read and write it in place (cpu); otherwise every host access goes through memory_copy_in / _out
  // (copy_out has finished when it returns) and memory_fill. device_synchronize waits for every kernel
  // queued so far (a no-op where kernels run synchronously, as on the cpu). device_resources: what the
  // engine checks of the device (above); called only where device_check is "".
  std::string (*device_check)();
  std::string (*device_description)();
  DeviceResources (*device_resources)();
  bool (*memory_on_host)();
  void* (*memory_allocate)(size_t bytes);
  void (*memory_free)(void* base);
  void (*memory_copy_in)(void* device, const void* host, size_t bytes);
  void (*memory_copy_out)(void* host, const void* device, size_t bytes);
  void (*memory_fill)(void* device, uint8_t byte, size_t bytes);
  // memory_is_device: `pointer` is this backend's device memory, which the host may not touch in place (false
  // for every pointer on the cpu); collectives of processes sharing a GPU stage such buffers through host
  // memory (comm/staged_communicator.h). device_count: the GPUs this process sees (0 on the cpu).
  bool (*memory_is_device)(const void* pointer);
  int (*device_count)();
  void (*device_synchronize)();

  // The dtype this backend stores activations, caches and kernel scratch in when the config's compute dtype
  // is `compute`: cpu keeps float32 and runs dtype=bfloat16 as bf16 inputs to every dense matmul (below).
  DType (*activation_dtype)(DType compute);

  // The dtype of an activation that only dense matmuls read (a norm's output before the projections, the
  // MLP's gated hidden) when the compute dtype is `compute`. cpu: bf16 under dtype=bfloat16, written rounded
  // by its producer (the *_forward_bf16 entries) and read by the matmuls as their bf16 input
  // (matmul_*_bf16_x), instead of each matmul rounding a float32 copy in the forward and again in the
  // backward. A backend without those entries returns activation_dtype(compute).
  DType (*matmul_input_dtype)(DType compute);

  // The kernels, grouped by the cpu header that documents them; each entry's signature, with the shape of
  // every argument, is the function type of its name in signatures.h.
  // matmul.h
  MatmulForward* matmul_forward;
  MatmulForwardBf16X* matmul_forward_bf16_x;
  MatmulBackward* matmul_backward;
  MatmulBackwardBf16X* matmul_backward_bf16_x;
  MatmulBf16ScratchElements* matmul_bf16_scratch_elements;
  // residual.h
  ResidualAdd* residual_add;
  // embedding.h
  EmbeddingForward* embedding_forward;
  EmbeddingBackward* embedding_backward;
  // cross_entropy.h
  UnembedCrossEntropy* unembed_cross_entropy;
  CrossEntropyScratchFloats* cross_entropy_scratch_floats;
  CrossEntropyBf16ScratchElements* cross_entropy_bf16_scratch_elements;
  UnembedLogits* unembed_logits;
  // rmsnorm.h
  RmsnormForward* rmsnorm_forward;
  RmsnormForwardBf16* rmsnorm_forward_bf16;
  RmsnormBackward* rmsnorm_backward;
  // layernorm.h
  LayernormForward* layernorm_forward;
  LayernormForwardBf16* layernorm_forward_bf16;
  LayernormBackward* layernorm_backward;
  // swiglu.h
  SwigluForward* swiglu_forward;
  SwigluForwardBf16* swiglu_forward_bf16;
  SwigluBackward* swiglu_backward;
  // gelu.h
  GeluForward* gelu_forward;
  GeluForwardBf16* gelu_forward_bf16;
  GeluBackward* gelu_backward;
  // rope.h
  RopeForward* rope_forward;
  RopeBackward* rope_backward;
  // column_slice.h
  ColumnSliceForward* column_slice_forward;
  ColumnSliceBackward* column_slice_backward;
  // attention.h
  AttentionForward* attention_forward;
  AttentionBackward* attention_backward;
  AttentionBackwardScratchFloats* attention_backward_scratch_floats;
  ContextAttentionForward* context_attention_forward;
  ContextAttentionBackward* context_attention_backward;
  ContextAttentionBackwardScratchFloats* context_attention_backward_scratch_floats;
  AttentionDecode* attention_decode;
  // The four above with bf16 products, which attention ops run under dtype=bfloat16 (attention_kernels
  // below). cpu: the AMX kernels on a CPU with AMX-BF16 (and the OS's tile permission), the AVX512-BF16 ones
  // on a CPU with AVX512-BF16 and without AMX (our CPUID reading; see cpu/backend.cpp), else the float32
  // ones; backends without bf16 attention put their float32 kernels here.
  AttentionForward* attention_forward_bf16;
  AttentionBackward* attention_backward_bf16;
  ContextAttentionForward* context_attention_forward_bf16;
  ContextAttentionBackward* context_attention_backward_bf16;
  // moe_router.h
  MoeRouterForward* moe_router_forward;
  MoeRouterBackward* moe_router_backward;
  MoeBalanceLossForward* moe_balance_loss_forward;
  MoeBalanceLossBackward* moe_balance_loss_backward;
  // moe_dispatch.h
  MoeRoutePlan* moe_route_plan;
  MoeGatherForward* moe_gather_forward;
  MoeDispatchPlan* moe_dispatch_plan;
  MoeReceivePlan* moe_receive_plan;
  MoeGatherBackward* moe_gather_backward;
  MoeCombineForward* moe_combine_forward;
  MoeCombineBackward* moe_combine_backward;
  // grouped_matmul.h
  GroupedMatmulForward* grouped_matmul_forward;
  GroupedMatmulBackward* grouped_matmul_backward;
  // rmsnorm.h, per-stream scales (Engram, mHC)
  RmsnormStreamsForward* rmsnorm_streams_forward;
  RmsnormStreamsBackward* rmsnorm_streams_backward;
  // engram_table.h, engram_gate.h, short_conv.h (Engram)
  EngramTableRows* engram_table_rows;
  EngramGateForward* engram_gate_forward;
  EngramGateBackward* engram_gate_backward;
  ShortConvForward* short_conv_forward;
  ShortConvBackward* short_conv_backward;
  ShortConvOutputForward* short_conv_output_forward;
  ShortConvOutputBackward* short_conv_output_backward;
  // mhc_mix.h, sinkhorn.h (mHC)
  MhcCoefficientsForward* mhc_coefficients_forward;
  MhcCoefficientsBackward* mhc_coefficients_backward;
  SinkhornForward* sinkhorn_forward;
  SinkhornBackward* sinkhorn_backward;
  MhcCollapseForward* mhc_collapse_forward;
  MhcCollapseBackward* mhc_collapse_backward;
  MhcExpandForward* mhc_expand_forward;
  MhcExpandBackward* mhc_expand_backward;
  MhcStreamsRepeat* mhc_streams_repeat;
  MhcStreamsSum* mhc_streams_sum;
  // adamw.h
  AdamWUpdate* adamw_update;
  SumOfSquares* sum_of_squares;
  // muon.h (cpu only: the engine refuses opt_type=muon on the cuda backend)
  MuonUpdate* muon_update;
  MuonScratchFloats* muon_scratch_floats;
};

// The backend whose kernels run ops on devices of `device_kind` (a topology's, e.g. "cpu", "h100"). NVIDIA
// kinds (a100, h100, h200, b200) get the cuda table: its kernels where this build has CUDA, else the cpu
// functions in their slots (planning only: device_check says why it cannot run); its scratch sizes and
// activation dtype are the cpu kernels' in both builds, so a plan does not depend on the build. Other
// accelerator kinds are planned with the cpu kernels but stored as their backend will store them:
// activations in the compute dtype, no bf16 rounding scratch.
const KernelBackend& kernel_backend_for_device(const std::string& device_kind);

// The attention kernels an op runs when the compute dtype is `compute`: the *_bf16 entries under bfloat16,
// the float32 ones otherwise.
AttentionKernels attention_kernels(const KernelBackend& backend, DType compute);

// Device kinds the cuda backend runs.
bool nvidia_device_kind(const std::string& device_kind);

}  // namespace meshtrain::kernels
