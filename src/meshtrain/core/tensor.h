// Shapes with logical axis names, and non-owning tensor views into the engine's arena.
// Logical axis names (embed, heads, kv_heads, head_dim, mlp, vocab, batch, length, ...) are what the
// sharding rules of the plan map to mesh axes; kernels only see sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

struct Shape {
  std::vector<int64_t> dims;      // sizes, outermost first
  std::vector<std::string> axes;  // one logical axis name per dim

  int64_t elements() const;
  std::string to_string() const;  // "[embed=1024, heads=16, head_dim=128]"
  bool operator==(const Shape& other) const = default;
};

// Sizes as a file or message shows them: "[1024, 16, 128]".
std::string dims_text(const std::vector<int64_t>& dims);

// A shape from (axis name, size) pairs: shape_of({{"embed", 64}, {"mlp", 96}}).
Shape shape_of(std::initializer_list<std::pair<std::string, int64_t>> named_dims);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;

  float* f32() const;
  int32_t* i32() const;
  int64_t elements() const { return shape.elements(); }
  size_t bytes() const { return static_cast<size_t>(elements()) * dtype_bytes(dtype); }
};

}  // namespace meshtrain
