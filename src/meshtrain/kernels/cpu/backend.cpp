// The cpu backend's kernel table: every entry is the cpu function of the same name.
#include "meshtrain/kernels/cpu/backend.h"

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/kernels/cpu/attention.h"
#include "meshtrain/kernels/cpu/column_slice.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/kernels/cpu/embedding.h"
#include "meshtrain/kernels/cpu/engram_gate.h"
#include "meshtrain/kernels/cpu/engram_table.h"
#include "meshtrain/kernels/cpu/gelu.h"
#include "meshtrain/kernels/cpu/grouped_matmul.h"
#include "meshtrain/kernels/cpu/layernorm.h"
#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cpu/memory.h"
#include "meshtrain/kernels/cpu/mhc_mix.h"
#include "meshtrain/kernels/cpu/moe_dispatch.h"
#include "meshtrain/kernels/cpu/moe_router.h"
#include "meshtrain/kernels/cpu/muon.h"
#include "meshtrain/kernels/cpu/residual.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"
#include "meshtrain/kernels/cpu/rope.h"
#include "meshtrain/kernels/cpu/short_conv.h"
#include "meshtrain/kernels/cpu/sinkhorn.h"
#include "meshtrain/kernels/cpu/swiglu.h"

namespace meshtrain::kernels {
namespace {

// The cpu kernels read and write float32; bf16 compute rounds the inputs of the dense matmuls only, and an
// activation only those matmuls read is stored rounded.
DType float32_activations(DType /*compute*/) {
  return DType::f32;
}
DType compute_dtype_matmul_inputs(DType compute) {
  return compute;
}

}  // namespace

// The AMX kernels (tile products) on CPUs with AMX-BF16 whose OS granted the tile permission; the
// AVX512-BF16 kernels (vdpbf16ps) on CPUs with AVX512-BF16 and no AMX; float32 otherwise, which includes an
// AMX CPU whose OS refused the tile permission (the machine line says so). On the Xeon with AMX (family 6
// model 207) vdpbf16ps runs at a quarter of vfmadd's instruction rate, and the vdpbf16ps kernels ran at
// 0.65-0.75x of the float32 ones there (bench/README.md, "Attention: bf16 products"), so they never run on
// an AMX CPU. (The engine refuses dtype=bfloat16 on a CPU with neither AVX512-BF16 nor AMX.)
AttentionProducts bf16_attention_products(const CpuFeatures& cpu) {
  if (cpu.amx_bf16 && cpu.avx512_bf16) return AttentionProducts::amx;
  if (cpu.avx512_bf16 && !cpu.amx_bf16 && !cpu.amx_refused_by_os) return AttentionProducts::avx512_bf16;
  return AttentionProducts::float32;
}

const KernelBackend& cpu_backend() {
  // Designated initialisers in declaration order; tests/unit/kernels/test_backend.cpp checks that no entry
  // is left null.
  const AttentionKernels bf16_attention = attention_kernels_with(bf16_attention_products(cpu_features()));
  static const KernelBackend table{
      .name = "cpu",
      .device_check = host_device_check,
      .device_description = host_device_description,
      .device_resources = host_device_resources,
      .memory_on_host = host_memory_on_host,
      .memory_allocate = host_memory_allocate,
      .memory_free = host_memory_free,
      .memory_copy_in = host_memory_copy_in,
      .memory_copy_out = host_memory_copy_out,
      .memory_fill = host_memory_fill,
      .memory_is_device = host_memory_is_device,
      .device_count = host_device_count,
      .device_synchronize = host_device_synchronize,
      .activation_dtype = float32_activations,
      .matmul_input_dtype = compute_dtype_matmul_inputs,
      .matmul_forward = matmul_forward,
      .matmul_forward_bf16_x = matmul_forward_bf16_x,
      .matmul_backward = matmul_backward,
      .matmul_backward_bf16_x = matmul_backward_bf16_x,
      .matmul_bf16_scratch_elements = matmul_bf16_scratch_elements,
      .residual_add = residual_add,
      .embedding_forward = embedding_forward,
      .embedding_backward = embedding_backward,
      .unembed_cross_entropy = unembed_cross_entropy,
      .cross_entropy_scratch_floats = cross_entropy_scratch_floats,
      .cross_entropy_bf16_scratch_elements = cross_entropy_bf16_scratch_elements,
      .unembed_logits = unembed_logits,
      .rmsnorm_forward = rmsnorm_forward,
      .rmsnorm_forward_bf16 = rmsnorm_forward_bf16,
      .rmsnorm_backward = rmsnorm_backward,
      .layernorm_forward = layernorm_forward,
      .layernorm_forward_bf16 = layernorm_forward_bf16,
      .layernorm_backward = layernorm_backward,
      .swiglu_forward = swiglu_forward,
      .swiglu_forward_bf16 = swiglu_forward_bf16,
      .swiglu_backward = swiglu_backward,
      .gelu_forward = gelu_forward,
      .gelu_forward_bf16 = gelu_forward_bf16,
      .gelu_backward = gelu_backward,
      .rope_forward = rope_forward,
      .rope_backward = rope_backward,
      .column_slice_forward = column_slice_forward,
      .column_slice_backward = column_slice_backward,
      .attention_forward = attention_forward,
      .attention_backward = attention_backward,
      .attention_backward_scratch_floats = attention_backward_scratch_floats,
      .context_attention_forward = context_attention_forward,
      .context_attention_backward = context_attention_backward,
      .context_attention_backward_scratch_floats = context_attention_backward_scratch_floats,
      .attention_decode = attention_decode,
      .attention_forward_bf16 = bf16_attention.forward,
      .attention_backward_bf16 = bf16_attention.backward,
      .context_attention_forward_bf16 = bf16_attention.context_forward,
      .context_attention_backward_bf16 = bf16_attention.context_backward,
      .moe_router_forward = moe_router_forward,
      .moe_router_backward = moe_router_backward,
      .moe_balance_loss_forward = moe_balance_loss_forward,
      .moe_balance_loss_backward = moe_balance_loss_backward,
      .moe_route_plan = moe_route_plan,
      .moe_gather_forward = moe_gather_forward,
      .moe_dispatch_plan = moe_dispatch_plan,
      .moe_receive_plan = moe_receive_plan,
      .moe_gather_backward = moe_gather_backward,
      .moe_combine_forward = moe_combine_forward,
      .moe_combine_backward = moe_combine_backward,
      .grouped_matmul_forward = grouped_matmul_forward,
      .grouped_matmul_backward = grouped_matmul_backward,
      .rmsnorm_streams_forward = rmsnorm_streams_forward,
      .rmsnorm_streams_backward = rmsnorm_streams_backward,
      .engram_table_rows = engram_table_rows,
      .engram_gate_forward = engram_gate_forward,
      .engram_gate_backward = engram_gate_backward,
      .short_conv_forward = short_conv_forward,
      .short_conv_backward = short_conv_backward,
      .short_conv_output_forward = short_conv_output_forward,
      .short_conv_output_backward = short_conv_output_backward,
      .mhc_coefficients_forward = mhc_coefficients_forward,
      .mhc_coefficients_backward = mhc_coefficients_backward,
      .sinkhorn_forward = sinkhorn_forward,
      .sinkhorn_backward = sinkhorn_backward,
      .mhc_collapse_forward = mhc_collapse_forward,
      .mhc_collapse_backward = mhc_collapse_backward,
      .mhc_expand_forward = mhc_expand_forward,
      .mhc_expand_backward = mhc_expand_backward,
      .mhc_streams_repeat = mhc_streams_repeat,
      .mhc_streams_sum = mhc_streams_sum,
      .adamw_update = adamw_update,
      .sum_of_squares = sum_of_squares,
      .muon_update = muon_update,
      .muon_scratch_floats = muon_scratch_floats,
  };
  return table;
}

}  // namespace meshtrain::kernels
