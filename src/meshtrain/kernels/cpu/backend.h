// The cpu backend's kernel table (kernels/backend.h): the functions of the headers in this folder.
#pragma once

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace meshtrain::kernels {

const KernelBackend& cpu_backend();

// Which attention kernels the cpu table runs under dtype=bfloat16 on a CPU with these features (see
// backend.cpp for why).
AttentionProducts bf16_attention_products(const CpuFeatures& cpu);

}  // namespace meshtrain::kernels
