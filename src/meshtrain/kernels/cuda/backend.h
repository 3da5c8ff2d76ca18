// The cuda backend's kernel table (kernels/backend.h): the functions of the headers in this folder. Built
// only where CMake found nvcc (MESHTRAIN_CUDA); kernels/backend.cpp fills its sizing entries (scratch sizes,
// activation dtype) from the cpu table, whose formulas these kernels take their scratch by.
#pragma once

#include "meshtrain/kernels/backend.h"

namespace meshtrain::kernels::cuda {

// The run entries of the dense decoder (Qwen3, GPT-2): matmul, attention, fused loss, norms, RoPE,
// SwiGLU / GELU, embedding, residual, column slices, AdamW; and of one rank's mixture of experts (router,
// balance loss, gather / combine, grouped matmul; kernels/backend.cpp adds the routing plan, run on the
// host). MLA on one GPU needs no entry beyond these. The entries of expert parallelism's block plans,
// context attention, Engram, mHC and decoding are null: engine.cpp refuses such a run on this backend before
// anything runs.
const KernelBackend& cuda_backend();

}  // namespace meshtrain::kernels::cuda

// The entry point kernels/backend.cpp finds with dlsym: the library is loaded only when an NVIDIA topology
// is asked for, so a cpu run never maps the CUDA runtime and cuBLASLt (about 200 MB of resident memory).
extern "C" const meshtrain::kernels::KernelBackend* meshtrain_cuda_backend();
