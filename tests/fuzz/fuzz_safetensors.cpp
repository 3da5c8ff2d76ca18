// The safetensors reader (io/safetensors.h) on arbitrary bytes: the header is validated, then every tensor
// of a float or integer dtype is read back whole, as the weight loader reads it.
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::string path =
      fuzz::write_scratch_file("model.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const SafetensorsEntry& entry : file.entries()) {
      // A validated entry's elements fit in the file, so the buffers below stay within its size.
      const size_t elements =
          (entry.end - entry.begin) / std::max<size_t>(1, safetensors_dtype_bytes(entry.dtype));
      if (entry.dtype == "F32" || entry.dtype == "BF16" || entry.dtype == "F16" || entry.dtype == "F64") {
        std::vector<float> values(elements);
        file.read_f32(entry.name, entry.shape, values.data());
      } else if (entry.dtype == "I32" || entry.dtype == "I64") {
        std::vector<int32_t> values(elements);
        file.read_i32(entry.name, entry.shape, values.data());
      }
    }
  } catch (const MeshError&) {
    // A rejected file is the expected outcome for most inputs.
  }
  return 0;
}
