// The cpu backend's kernel table (kernels/backend.h): the functions of the headers in this folder.
#pragma once

#include "meshtrain/kernels/backend.h"

namespace meshtrain::kernels {

const KernelBackend& cpu_backend();

}  // namespace meshtrain::kernels
