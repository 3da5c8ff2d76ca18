// The cuda backend's kernel table: every entry is the cuda function of the same name.
#include "meshtrain/kernels/cuda/backend.h"

#include "meshtrain/kernels/cuda/adamw.h"
#include "meshtrain/kernels/cuda/attention.h"
#include "meshtrain/kernels/cuda/column_slice.h"
#include "meshtrain/kernels/cuda/cross_entropy.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/embedding.h"
#include "meshtrain/kernels/cuda/gelu.h"
#include "meshtrain/kernels/cuda/layernorm.h"
#include "meshtrain/kernels/cuda/matmul.h"
#include "meshtrain/kernels/cuda/residual.h"
#include "meshtrain/kernels/cuda/rmsnorm.h"
#include "meshtrain/kernels/cuda/rope.h"
#include "meshtrain/kernels/cuda/swiglu.h"

namespace meshtrain::kernels::cuda {

const KernelBackend& cuda_backend() {
  // Designated initialisers in declaration order; entries not named are null (see backend.h).
  static const KernelBackend table{
      .name = "cuda",
      .device_check = device_check,
      .device_description = device_description,
      .memory_on_host = memory_on_host,
      .memory_allocate = memory_allocate,
      .memory_free = memory_free,
      .memory_copy_in = memory_copy_in,
      .memory_copy_out = memory_copy_out,
      .memory_fill = memory_fill,
      .activation_dtype = nullptr,  // sizing: kernels/backend.cpp
      .matmul_forward = matmul_forward,
      .matmul_backward = matmul_backward,
      .matmul_bf16_scratch_elements = nullptr,
      .residual_add = residual_add,
      .embedding_forward = embedding_forward,
      .embedding_backward = embedding_backward,
      .unembed_cross_entropy = unembed_cross_entropy,
      .cross_entropy_scratch_floats = nullptr,
      .cross_entropy_bf16_scratch_elements = nullptr,
      .unembed_logits = unembed_logits,
      .rmsnorm_forward = rmsnorm_forward,
      .rmsnorm_backward = rmsnorm_backward,
      .layernorm_forward = layernorm_forward,
      .layernorm_backward = layernorm_backward,
      .swiglu_forward = swiglu_forward,
      .swiglu_backward = swiglu_backward,
      .gelu_forward = gelu_forward,
      .gelu_backward = gelu_backward,
      .rope_forward = rope_forward,
      .rope_backward = rope_backward,
      .column_slice_forward = column_slice_forward,
      .column_slice_backward = column_slice_backward,
      .attention_forward = attention_forward,
      .attention_backward = attention_backward,
      .attention_backward_scratch_floats = nullptr,
      .adamw_update = adamw_update,
      .sum_of_squares = sum_of_squares,
  };
  return table;
}

}  // namespace meshtrain::kernels::cuda
