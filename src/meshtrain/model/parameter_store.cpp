// The parameter store (see parameter_store.h).
#include "meshtrain/model/parameter_store.h"

#include <cstring>

#include "meshtrain/core/error.h"

namespace meshtrain {

ParameterStore::ParameterStore(const ModelSpec& spec, std::vector<TensorView> values) {
  MT_CHECK(values.size() == spec.parameters.size(), "one stored value per parameter of the spec");
  for (size_t p = 0; p < values.size(); ++p) {
    const ParameterDecl& parameter = spec.parameters[p];
    entries_.push_back({spec.buffer(parameter.value).name, parameter, values[p]});
    index_.emplace(entries_.back().name, p);
  }
}

std::optional<size_t> ParameterStore::find(const std::string& parameter_name) const {
  const auto found = index_.find(parameter_name);
  if (found == index_.end()) return std::nullopt;
  return found->second;
}

void ParameterStore::copy_from(const ParameterStore& source) {
  MT_CHECK(source.size() == size(), "parameter stores of different models");
  for (size_t p = 0; p < size(); ++p) {
    const std::optional<size_t> from = source.find(name(p));
    MT_CHECK(from.has_value(), "the source store has no parameter " + name(p));
    const TensorView target = value(p), origin = source.value(*from);
    MT_CHECK(target.shape.dims == origin.shape.dims && target.dtype == origin.dtype,
             name(p) + " is stored as " + origin.shape.to_string() + " in the source, " +
                 target.shape.to_string() + " here");
    std::memcpy(target.data, origin.data, target.bytes());
  }
}

}  // namespace meshtrain
