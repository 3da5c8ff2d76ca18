// The cpu backend's kernel table (kernels/backend.h): the functions of the headers in this folder.
#pragma once

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/backend.h"

namespace meshtrain::kernels {

const KernelBackend& cpu_backend();

// Which attention kernels the cpu table runs under dtype=bfloat16 on a CPU with these features (see
// backend.cpp for why).
enum class Bf16AttentionKernels { amx, avx512_bf16, float32 };
Bf16AttentionKernels bf16_attention_kernels(const CpuFeatures& cpu);

}  // namespace meshtrain::kernels
