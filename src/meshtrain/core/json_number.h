// Whole numbers read from the JSON files meshtrain is handed (checkpoint indexes and metadata). nlohmann's
// get<T>() converts whatever number it finds: a float outside T's range with undefined behaviour, a negative
// number to an unsigned type by wrapping. These take only an integer inside the given range; anything else
// (a float, a string, a number out of range) fails naming `where`, what was expected and what was found.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace meshtrain {

// An integer in [min, max]; `what` names the field in the error ("chunk offset").
int64_t json_integer(const nlohmann::json& value, int64_t min, int64_t max, const std::string& where,
                     const std::string& what, const std::string& hint = "");
// A non-negative integer up to `max` (for byte counts and checksums up to 2^64 - 1).
uint64_t json_unsigned(const nlohmann::json& value, uint64_t max, const std::string& where,
                       const std::string& what, const std::string& hint = "");

}  // namespace meshtrain
