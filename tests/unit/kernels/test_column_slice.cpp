// Column slices (kernels/cpu/column_slice.h): the fast copies equal the reference exactly (they only move
// values; the backward's sum runs in the same order), and the reference backward is the forward's
// transpose (finite differences of a weighted sum of the forward's output).
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/column_slice.h"

namespace {

using meshtrain::kernels::column_slice_backward;
using meshtrain::kernels::column_slice_forward;
using meshtrain::kernels::column_slice_reference_backward;
using meshtrain::kernels::column_slice_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

// A slice of columns [offset, offset + W) of rows of x_stride into columns [out_offset, ...) of rows of
// out_stride, each source row to `repeat` rows; the columns the slice does not write keep their values.
struct Slice {
  int64_t R, W, repeat, out_stride, x_stride, out_offset, x_offset;
};

void check_fast_equals_reference(const Slice& s, bool zeros) {
  const std::vector<float> x = to_float(random_values(s.R * s.x_stride, 11));
  const std::vector<float> dout = to_float(random_values(s.R * s.repeat * s.out_stride, 12));
  const std::vector<float> untouched = to_float(random_values(s.R * s.repeat * s.out_stride, 13));
  std::vector<float> out = untouched, out_reference = untouched;
  const float* source = zeros ? nullptr : x.data() + s.x_offset;
  column_slice_forward(out.data() + s.out_offset, source, s.R, s.W, s.repeat, s.out_stride, s.x_stride);
  column_slice_reference_forward(out_reference.data() + s.out_offset, source, s.R, s.W, s.repeat,
                                 s.out_stride, s.x_stride);
  EXPECT_EQ(out, out_reference);
  EXPECT_NE(out, untouched);  // the slice was written
  // Columns outside the slice keep their values.
  for (int64_t row = 0; row < s.R * s.repeat; ++row) {
    for (int64_t j = 0; j < s.out_stride; ++j) {
      if (j >= s.out_offset && j < s.out_offset + s.W) continue;
      ASSERT_EQ(out[row * s.out_stride + j], untouched[row * s.out_stride + j]) << row << " " << j;
    }
  }

  const std::vector<float> dx_untouched(s.R * s.x_stride, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dx = dx_untouched, dx_reference = dx_untouched;
  column_slice_backward(dx.data() + s.x_offset, dout.data() + s.out_offset, s.R, s.W, s.repeat, s.x_stride,
                        s.out_stride);
  column_slice_reference_backward(dx_reference.data() + s.x_offset, dout.data() + s.out_offset, s.R, s.W,
                                  s.repeat, s.x_stride, s.out_stride);
  for (int64_t r = 0; r < s.R; ++r) {
    for (int64_t j = 0; j < s.W; ++j) {
      const size_t at = static_cast<size_t>(r * s.x_stride + s.x_offset + j);
      ASSERT_EQ(dx[at], dx_reference[at]) << r << " " << j;
    }
  }
}

TEST(ColumnSlice, FastEqualsReference) {
  // MLA's uses: q's rope columns out of [N, H, 24] (8 at offset 16), a shared rope key broadcast over 4
  // heads, value columns into a wider zero-padded head; and one large enough to run threaded.
  check_fast_equals_reference({12, 8, 1, 8, 24, 0, 16}, false);
  check_fast_equals_reference({6, 8, 4, 24, 8, 16, 0}, false);
  check_fast_equals_reference({24, 16, 1, 24, 40, 0, 24}, false);
  check_fast_equals_reference({24, 8, 1, 24, 40, 16, 0}, true);
  check_fast_equals_reference({512, 64, 8, 192, 64, 128, 0}, false);
}

TEST(ColumnSlice, BackwardIsTheForwardsTranspose) {
  const Slice s{5, 6, 3, 10, 9, 2, 1};
  std::vector<double> x = random_values(s.R * s.x_stride, 21);
  const std::vector<double> weights = random_values(s.R * s.repeat * s.out_stride, 22);
  auto loss = [&] {
    std::vector<double> out(s.R * s.repeat * s.out_stride, 0.0);
    column_slice_reference_forward(out.data() + s.out_offset, x.data() + s.x_offset, s.R, s.W, s.repeat,
                                   s.out_stride, s.x_stride);
    return weighted_sum(out, weights);
  };
  // The backward writes the sliced columns only; the others' gradient is zero.
  std::vector<double> dx(s.R * s.x_stride, 0.0);
  column_slice_reference_backward(dx.data() + s.x_offset, weights.data() + s.out_offset, s.R, s.W, s.repeat,
                                  s.x_stride, s.out_stride);
  // Linear in x: central differences carry only rounding of order 1e-16 * |loss| / 1e-6.
  const double bound = 1e-7;
  const double error = relative_error(dx, numeric_gradient(loss, x));
  report_error("column_slice reference dx vs finite differences", error, bound);
  EXPECT_LT(error, bound);
}

}  // namespace
