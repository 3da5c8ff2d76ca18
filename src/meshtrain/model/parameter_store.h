// The model's parameters as one store: each parameter of a spec (by index, or by its checkpoint name) with
// the view of its stored value on this device. The runtime that allocated the values fills it; training,
// checkpoints and decoding find parameters through it, never by their own name lists.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/spec.h"

namespace meshtrain {

class ParameterStore {
 public:
  ParameterStore() = default;
  // `values[p]` views the stored value of spec.parameters[p] (a shard of it under FSDP). The store copies
  // what it needs of the spec, so it moves with its runtime.
  ParameterStore(const ModelSpec& spec, std::vector<TensorView> values);

  size_t size() const { return entries_.size(); }
  const ParameterDecl& decl(size_t index) const { return entries_.at(index).decl; }
  // The checkpoint name, e.g. "decoder/layers_0/mlp/wo/kernel".
  const std::string& name(size_t index) const { return entries_.at(index).name; }
  TensorView value(size_t index) const { return entries_.at(index).value; }
  std::optional<size_t> find(const std::string& name) const;

  // Copies every value of `source` into this store's parameter of the same name. Both must hold the same
  // parameters at the same local shapes (a training engine's and a decode plan's, on one device).
  void copy_from(const ParameterStore& source);

 private:
  struct Entry {
    std::string name;
    ParameterDecl decl;
    TensorView value;
  };
  std::vector<Entry> entries_;           // in the spec's parameter order
  std::map<std::string, size_t> index_;  // checkpoint name -> parameter index
};

}  // namespace meshtrain
