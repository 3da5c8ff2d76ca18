// How a checkpoint lays out the decoder layers' tensors (shared/specs/layers-and-checkpoints.md): each
// layer's under its canonical name ("decoder/layers_3/mlp/wo/kernel"), or stacked per scan group
// ("decoder/layers/mlp/wo/kernel", the layer axis at min(param_scan_axis, rank) of the layer's tensor).
// A run finds every tensor it needs through the layout the checkpoint was saved in, so a checkpoint loads
// into either layout, whatever the two param_scan_axis values are.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/model/segments.h"

namespace meshtrain {

// Where one layer's tensor (or any other parameter's) is in a checkpoint file.
struct CheckpointTensorPlace {
  std::string name;           // the file's tensor
  std::vector<int64_t> dims;  // its shape in the file
  int64_t index = -1;         // a layer of a stacked tensor: its index on `axis`; -1: the whole tensor
  int64_t axis = 0;
};

class CheckpointLayout {
 public:
  // The layout of a model (its segments) saved stacked or per layer.
  CheckpointLayout(const Config& model, bool stacked, int64_t scan_axis);
  // What a checkpoint's metadata.json records (scan_layers, param_scan_axis; format 1 wrote neither: per
  // layer). A scan_layers that is not true or false, or a param_scan_axis that is not an integer >= 0, fails
  // naming `metadata_path`.
  static CheckpointLayout saved(const nlohmann::json& metadata, const Config& model,
                                const std::string& metadata_path);

  bool stacked() const { return stacked_; }
  // `name`: a canonical name (a layer's "decoder/layers_3/...", or "token_embedder/embedding"), optionally
  // after a moment's prefix ("adam_m/"); `dims`: that tensor's global shape.
  CheckpointTensorPlace place(const std::string& name, const std::vector<int64_t>& dims) const;
  // Reads the tensor `place` names (of `place(...)`'s dims) into `out`, row-major.
  static void read(const SafetensorsFile& file, const CheckpointTensorPlace& place, float* out);

 private:
  std::vector<LayerSegment> segments_;
  bool stacked_ = false;
  int64_t scan_axis_ = 1;
};

}  // namespace meshtrain
