// Muon's step op (see muon.h).
#include "meshtrain/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/arguments.h"  // newton_schulz_flops

namespace meshtrain {

std::vector<std::string> muon_moment_names() {
  return {"muon_mu"};
}

MuonMatrices muon_matrices(const ModelSpec& spec, const ParameterDecl& parameter) {
  const Shape& shape = spec.buffer(parameter.value).shape;
  // A dim tensor parallelism splits counts whole: the plan gathers the tensor ranks' parts (plan.cpp refuses
  // the kv heads' replication, whose parts would repeat).
  const int64_t tensor_ranks = spec.sharding.mesh().size(MeshAxis::tensor);
  std::vector<int64_t> matrix_dims;
  for (size_t axis = 0; axis < shape.dims.size(); ++axis) {
    if (shape.axes[axis] == "layers" || shape.axes[axis] == "experts") continue;
    const std::vector<MeshAxis>& split = spec.sharding.compute(shape.axes[axis]).axes;
    const bool over_tensor = std::find(split.begin(), split.end(), MeshAxis::tensor) != split.end();
    matrix_dims.push_back(shape.dims[axis] * (over_tensor ? tensor_ranks : 1));
  }
  const auto input_axes = static_cast<size_t>(parameter.input_axes);
  MT_CHECK(matrix_dims.size() > input_axes && input_axes > 0,
           "a Muon parameter with input and output axes: " + parameter.canonical_name);
  MuonMatrices matrices;
  matrices.rows = 1;
  matrices.cols = 1;
  for (size_t axis = 0; axis < matrix_dims.size(); ++axis)
    (axis < input_axes ? matrices.rows : matrices.cols) *= matrix_dims[axis];
  matrices.batch = 1;
  for (size_t axis = 0; axis < shape.dims.size(); ++axis) {
    if (shape.axes[axis] == "layers" || shape.axes[axis] == "experts") matrices.batch *= shape.dims[axis];
  }
  return matrices;
}

double muon_update_scale(const Config& config, int64_t rows, int64_t cols) {
  if (config.muon_consistent_rms)
    return *config.muon_consistent_rms * std::sqrt(static_cast<double>(std::max(rows, cols)));
  return std::sqrt(std::max(1.0, static_cast<double>(cols) / static_cast<double>(rows)));
}

OpDecl muon_step_op(const ModelSpec& spec, const Config& config, size_t parameter,
                    const ParameterState& state, const ParameterGroup& group, BufferId scratch) {
  const ParameterDecl& decl = spec.parameters[parameter];
  const BufferId value = decl.value, gradient = decl.gradient, momentum = state.moments.at(0);
  const MuonMatrices matrices = muon_matrices(spec, decl);
  const auto beta = static_cast<float>(config.muon_beta), eps = static_cast<float>(config.adam_eps);
  const auto decay = static_cast<float>(group.muon_weight_decay_rate);
  const auto update_scale = static_cast<float>(muon_update_scale(config, matrices.rows, matrices.cols));
  const double learning_rate_multiplier = group.learning_rate_multiplier;
  const std::vector<bool> weight_decay = state.weight_decay;
  // Per element: the momentum, its Nesterov look-ahead and the update (as AdamW's 12); per matrix the
  // Newton-Schulz iteration's exact count (kernels/cpu/muon.h).
  const double flops =
      12.0 * static_cast<double>(matrices.batch * matrices.rows * matrices.cols) +
      static_cast<double>(matrices.batch) * kernels::newton_schulz_flops(matrices.rows, matrices.cols);
  std::vector<BufferId> touched = {value, momentum};
  if (state.master != kNoBuffer) touched.push_back(state.master);
  std::vector<BufferId> reads = touched;
  reads.push_back(gradient);
  touched.push_back(scratch);  // written before it is read, within the op
  OpDecl op{"optimizer/muon/" + decl.canonical_name,
            reads,
            touched,
            flops,
            [=](const OpContext& context) {
              const UpdateState& u = *context.update;
              if (u.nonfinite) return;  // as AdamW's: the step leaves every parameter as it was
              const kernels::MuonStep muon{static_cast<float>(u.learning_rate * learning_rate_multiplier),
                                           beta,
                                           eps,
                                           decay,
                                           update_scale,
                                           u.step + 1,
                                           static_cast<float>(u.gradient_scale)};
              // A stacked parameter's layers one by one, each with its layer's decay (a layer block holds
              // its experts' matrices).
              const TensorView whole = context.view(value);
              MT_CHECK(whole.elements() == matrices.batch * matrices.rows * matrices.cols,
                       "Muon steps whole matrices (the plan gathers a sharded one's)");
              const auto blocks = static_cast<int64_t>(weight_decay.size());
              const int64_t block = whole.elements() / blocks;
              for (int64_t i = 0; i < blocks; ++i) {
                context.kernels->muon_update(whole.f32() + i * block, context.f32(gradient) + i * block,
                                             context.f32(momentum) + i * block, matrices.batch / blocks,
                                             matrices.rows, matrices.cols, muon,
                                             weight_decay[static_cast<size_t>(i)], context.f32(scratch));
              }
            },
            OpKind::optimizer};
  op.role = OpRole::muon;
  op.parameter = static_cast<int32_t>(parameter);
  return op;
}

}  // namespace meshtrain
