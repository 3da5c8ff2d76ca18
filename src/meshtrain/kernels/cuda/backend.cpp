// The cuda backend's kernel table: every entry is the cuda function of the same name.
#include "meshtrain/kernels/cuda/backend.h"

#include "meshtrain/kernels/cuda/adamw.h"
#include "meshtrain/kernels/cuda/attention.h"
#include "meshtrain/kernels/cuda/column_slice.h"
#include "meshtrain/kernels/cuda/cross_entropy.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/embedding.h"
#include "meshtrain/kernels/cuda/engram_gate.h"
#include "meshtrain/kernels/cuda/engram_table.h"
#include "meshtrain/kernels/cuda/gelu.h"
#include "meshtrain/kernels/cuda/grouped_matmul.h"
#include "meshtrain/kernels/cuda/layernorm.h"
#include "meshtrain/kernels/cuda/matmul.h"
#include "meshtrain/kernels/cuda/mhc_mix.h"
#include "meshtrain/kernels/cuda/moe_dispatch.h"
#include "meshtrain/kernels/cuda/moe_router.h"
#include "meshtrain/kernels/cuda/residual.h"
#include "meshtrain/kernels/cuda/rmsnorm.h"
#include "meshtrain/kernels/cuda/rope.h"
#include "meshtrain/kernels/cuda/short_conv.h"
#include "meshtrain/kernels/cuda/sinkhorn.h"
#include "meshtrain/kernels/cuda/swiglu.h"

namespace meshtrain::kernels::cuda {

const KernelBackend& cuda_backend() {
  static const KernelBackend table = [] {
    KernelBackend cuda{};  // entries not set here stay null (see backend.h); sizing: kernels/backend.cpp
    cuda.name = "cuda";
    cuda.device_check = device_check;
    cuda.device_description = device_description;
    cuda.device_resources = device_resources;
    cuda.memory_on_host = memory_on_host;
    cuda.memory_allocate = memory_allocate;
    cuda.memory_free = memory_free;
    cuda.memory_copy_in = memory_copy_in;
    cuda.memory_copy_out = memory_copy_out;
    cuda.memory_fill = memory_fill;
    cuda.memory_is_device = memory_is_device;
    cuda.device_count = device_count;
    cuda.device_synchronize = synchronize;
    cuda.matmul_forward = matmul_forward;
    cuda.matmul_forward_bf16_x = matmul_forward_bf16_x;
    cuda.matmul_backward = matmul_backward;
    cuda.matmul_backward_bf16_x = matmul_backward_bf16_x;
    cuda.residual_add = residual_add;
    cuda.embedding_forward = embedding_forward;
    cuda.embedding_backward = embedding_backward;
    cuda.unembed_cross_entropy = unembed_cross_entropy;
    cuda.unembed_logits = unembed_logits;
    cuda.rmsnorm_forward = rmsnorm_forward;
    cuda.rmsnorm_forward_bf16 = rmsnorm_forward_bf16;
    cuda.rmsnorm_backward = rmsnorm_backward;
    cuda.layernorm_forward = layernorm_forward;
    cuda.layernorm_forward_bf16 = layernorm_forward_bf16;
    cuda.layernorm_backward = layernorm_backward;
    cuda.swiglu_forward = swiglu_forward;
    cuda.swiglu_forward_bf16 = swiglu_forward_bf16;
    cuda.swiglu_backward = swiglu_backward;
    cuda.gelu_forward = gelu_forward;
    cuda.gelu_forward_bf16 = gelu_forward_bf16;
    cuda.gelu_backward = gelu_backward;
    cuda.rope_forward = rope_forward;
    cuda.rope_backward = rope_backward;
    cuda.column_slice_forward = column_slice_forward;
    cuda.column_slice_backward = column_slice_backward;
    cuda.attention_forward = attention_forward;
    cuda.attention_backward = attention_backward;
    cuda.attention_forward_bf16 = attention_forward_bf16;
    cuda.attention_backward_bf16 = attention_backward_bf16;
    // Engram and mHC: built and compiled, not yet run on a GPU (README.md).
    cuda.rmsnorm_streams_forward = rmsnorm_streams_forward;
    cuda.rmsnorm_streams_backward = rmsnorm_streams_backward;
    cuda.engram_table_rows = engram_table_rows;
    cuda.engram_gate_forward = engram_gate_forward;
    cuda.engram_gate_backward = engram_gate_backward;
    cuda.short_conv_forward = short_conv_forward;
    cuda.short_conv_backward = short_conv_backward;
    cuda.short_conv_output_forward = short_conv_output_forward;
    cuda.short_conv_output_backward = short_conv_output_backward;
    cuda.mhc_coefficients_forward = mhc_coefficients_forward;
    cuda.mhc_coefficients_backward = mhc_coefficients_backward;
    cuda.sinkhorn_forward = sinkhorn_forward;
    cuda.sinkhorn_backward = sinkhorn_backward;
    cuda.mhc_collapse_forward = mhc_collapse_forward;
    cuda.mhc_collapse_backward = mhc_collapse_backward;
    cuda.mhc_expand_forward = mhc_expand_forward;
    cuda.mhc_expand_backward = mhc_expand_backward;
    cuda.mhc_streams_repeat = mhc_streams_repeat;
    cuda.mhc_streams_sum = mhc_streams_sum;
    cuda.moe_router_forward = moe_router_forward;
    cuda.moe_router_backward = moe_router_backward;
    cuda.moe_balance_loss_forward = moe_balance_loss_forward;
    cuda.moe_balance_loss_backward = moe_balance_loss_backward;
    cuda.moe_gather_forward = moe_gather_forward;
    cuda.moe_gather_backward = moe_gather_backward;
    cuda.moe_combine_forward = moe_combine_forward;
    cuda.moe_combine_backward = moe_combine_backward;
    cuda.grouped_matmul_forward = grouped_matmul_forward;
    cuda.grouped_matmul_backward = grouped_matmul_backward;
    cuda.adamw_update = adamw_update;
    cuda.sum_of_squares = sum_of_squares;
    return cuda;
  }();
  return table;
}

}  // namespace meshtrain::kernels::cuda

extern "C" const meshtrain::kernels::KernelBackend* meshtrain_cuda_backend() {
  return &meshtrain::kernels::cuda::cuda_backend();
}
