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
  static const KernelBackend table = [] {
    KernelBackend cuda{};  // entries not set here stay null (see backend.h); sizing: kernels/backend.cpp
    cuda.name = "cuda";
    cuda.device_check = device_check;
    cuda.device_description = device_description;
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
    cuda.matmul_backward = matmul_backward;
    cuda.residual_add = residual_add;
    cuda.embedding_forward = embedding_forward;
    cuda.embedding_backward = embedding_backward;
    cuda.unembed_cross_entropy = unembed_cross_entropy;
    cuda.unembed_logits = unembed_logits;
    cuda.rmsnorm_forward = rmsnorm_forward;
    cuda.rmsnorm_backward = rmsnorm_backward;
    cuda.layernorm_forward = layernorm_forward;
    cuda.layernorm_backward = layernorm_backward;
    cuda.swiglu_forward = swiglu_forward;
    cuda.swiglu_backward = swiglu_backward;
    cuda.gelu_forward = gelu_forward;
    cuda.gelu_backward = gelu_backward;
    cuda.rope_forward = rope_forward;
    cuda.rope_backward = rope_backward;
    cuda.column_slice_forward = column_slice_forward;
    cuda.column_slice_backward = column_slice_backward;
    cuda.attention_forward = attention_forward;
    cuda.attention_backward = attention_backward;
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
