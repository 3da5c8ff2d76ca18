#include "meshtrain/core/tensor.h"

#include "meshtrain/core/error.h"

namespace meshtrain {

int64_t Shape::elements() const {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;
  return count;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) text += ", ";
    text += (i < axes.size() ? axes[i] + "=" : "") + std::to_string(dims[i]);
  }
  return text + "]";
}

Shape shape_of(std::initializer_list<std::pair<std::string, int64_t>> named_dims) {
  Shape shape;
  for (const auto& [axis, size] : named_dims) {
    shape.axes.push_back(axis);
    shape.dims.push_back(size);
  }
  return shape;
}

float* TensorView::f32() const {
  MT_CHECK(dtype == DType::f32, "tensor is " + dtype_config_name(dtype) + ", not float32");
  return static_cast<float*>(data);
}

int32_t* TensorView::i32() const {
  MT_CHECK(dtype == DType::i32, "tensor is " + dtype_config_name(dtype) + ", not int32");
  return static_cast<int32_t*>(data);
}

}  // namespace meshtrain
