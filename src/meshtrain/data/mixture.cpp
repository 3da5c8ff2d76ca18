// dataset_path's mixture forms and Tijdeman's draw; the rules are in mixture.h.
#include "meshtrain/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {
namespace {

const char* const kWhere = "config key 'dataset_path'";
const char* const kStringExample = "dataset_path=\"data/web*.jsonl.zst,0.7;data/code*.jsonl.zst,0.3\"";
const char* const kListExample =
    "dataset_path: [{path: data/web, weight: 0.7}, {path: data/code, weight: 0.3}]";

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\n\r") - first + 1);
}

std::string entry_where(size_t index, size_t entries, const std::string& entry) {
  return std::string(kWhere) + ", entry " + std::to_string(index + 1) + " of " + std::to_string(entries) +
         " ('" + entry + "')";
}

// A weight written as text: the whole text a positive finite number.
double parse_weight(const std::string& text, const std::string& where, const char* example) {
  char* end = nullptr;
  const double weight = std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size();
  if (!number || !std::isfinite(weight) || weight <= 0) {
    fail(where, "a positive finite number as the weight", "'" + text + "'",
         std::string("weights are relative shares of the rows, e.g. ") + example);
  }
  return weight;
}

// MaxText's grain_train_files form: "pattern,weight;pattern,weight".
std::vector<MixtureSource> parse_string_form(const std::string& text) {
  std::vector<std::string> entries;
  for (size_t start = 0;;) {
    const size_t semicolon = text.find(';', start);
    entries.push_back(
        text.substr(start, semicolon == std::string::npos ? std::string::npos : semicolon - start));
    if (semicolon == std::string::npos) break;
    start = semicolon + 1;
  }
  std::vector<MixtureSource> sources;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry = trimmed(entries[i]);
    const std::string where = entry_where(i, entries.size(), entry);
    if (entry.empty()) {
      fail(where, "pattern,weight", "an empty entry",
           std::string("entries are separated by one ';', with none at the end: ") + kStringExample);
    }
    const size_t comma = entry.rfind(',');
    if (comma == std::string::npos) {
      fail(where, "pattern,weight", "no ',' and weight after the pattern",
           std::string("give every source its weight: ") + kStringExample);
    }
    const std::string path = trimmed(entry.substr(0, comma));
    if (path.empty()) {
      fail(where, "pattern,weight", "no pattern before the ','",
           std::string("name the source's files (a file, a folder or a glob) before its weight: ") +
               kStringExample);
    }
    sources.push_back({path, parse_weight(trimmed(entry.substr(comma + 1)), where, kStringExample), 0});
  }
  return sources;
}

// A list of {path, weight}, JSON (what a YAML list under dataset_path arrives as).
std::vector<MixtureSource> parse_list_form(const std::string& text) {
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    fail(kWhere, "a list of {path, weight}", std::string("unreadable JSON: ") + error.what(),
         std::string("in YAML: ") + kListExample);
  }
  if (!list.is_array() || list.empty()) {
    fail(kWhere, "a list of {path, weight}",
         list.is_array() ? "an empty list" : "a JSON " + std::string(list.type_name()),
         std::string("in YAML: ") + kListExample);
  }
  std::vector<MixtureSource> sources;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& entry = list[i];
    const std::string where = entry_where(i, list.size(), entry.dump());
    if (!entry.is_object()) {
      fail(where, "a mapping {path, weight}", std::string("a ") + entry.type_name(),
           std::string("in YAML: ") + kListExample);
    }
    for (const auto& [key, value] : entry.items()) {
      if (key != "path" && key != "weight") {
        fail(where, "the fields path and weight", "a field '" + key + "'",
             "did you mean '" + closest_name(key, {"path", "weight"}) + "'?");
      }
    }
    for (const char* field : {"path", "weight"}) {
      if (!entry.contains(field)) {
        fail(where, "the fields path and weight", std::string("no ") + field,
             std::string("give every source both: ") + kListExample);
      }
    }
    const nlohmann::json& path = entry["path"];
    if (!path.is_string() || trimmed(path.get<std::string>()).empty()) {
      fail(where, "a path: a file, a folder or a glob", path.is_string() ? "an empty path" : path.dump(),
           std::string("name the source's files: ") + kListExample);
    }
    const nlohmann::json& weight = entry["weight"];
    const std::string weight_text = weight.is_string() ? trimmed(weight.get<std::string>()) : weight.dump();
    sources.push_back({path.get<std::string>(), parse_weight(weight_text, where, kListExample), 0});
  }
  return sources;
}

bool is_list_form(const std::string& text) {
  const std::string start = trimmed(text);
  return start.size() >= 2 && start.front() == '[' && trimmed(start.substr(1)).front() == '{';
}

}  // namespace

std::vector<MixtureSource> parse_dataset_path(const std::string& text) {
  if (!is_list_form(text) && text.find(';') == std::string::npos) return {{text, 1, 1}};
  std::vector<MixtureSource> sources = is_list_form(text) ? parse_list_form(text) : parse_string_form(text);
  // Scaled by the largest weight first, so the sum cannot overflow.
  double largest = 0, sum = 0;
  for (const MixtureSource& source : sources) largest = std::max(largest, source.weight);
  for (const MixtureSource& source : sources) sum += source.weight / largest;
  for (MixtureSource& source : sources) source.share = source.weight / largest / sum;
  return sources;
}

std::string mixture_entry_name(const std::vector<MixtureSource>& entries, size_t index,
                               const std::string& key) {
  return "config key '" + key + "', entry " + std::to_string(index + 1) + " of " +
         std::to_string(entries.size()) + " ('" + entries[index].path + "')";
}

uint64_t mixture_source_seed(uint64_t seed, size_t source) {
  const PhiloxKey key = philox_key(seed, "meshtrain/mixture-source=" + std::to_string(source));
  return (uint64_t{key[0]} << 32) | key[1];
}

namespace {
// Decimal units: weights written as decimals keep their exact ties (0.5 x 2 = 0.3 + 0.7).
constexpr double kShareUnits = 1e12;
}  // namespace

MixtureDraw::MixtureDraw(const std::vector<double>& shares, std::vector<uint64_t> rows_per_epoch)
    : rows_per_epoch_(std::move(rows_per_epoch)), counts_(shares.size(), 0) {
  MT_CHECK(!shares.empty() && shares.size() == rows_per_epoch_.size(), "a share and a row count per source");
  for (size_t i = 0; i < shares.size(); ++i) {
    MT_CHECK(shares[i] > 0 && rows_per_epoch_[i] > 0, "positive shares and rows per epoch");
    // A share below 10^-12 still gets its rows now and then rather than none.
    units_.push_back(std::max<int64_t>(1, std::llround(shares[i] * kShareUnits)));
    total_units_ += units_.back();
  }
}

size_t MixtureDraw::pick() const {
  const size_t k = counts_.size();
  if (k == 1) return 0;
  // Tijdeman's rule in units of 1 / (D x total_units_), D = 2k - 2, exact in 128 bits (units ~2^40, counts
  // and rows < 2^64, D <= 2^7 for any k a config can hold). Source i may be drawn when share_i t - count_i >=
  // 1 / D; of those, the one whose deadline (count_i + 1 - 1 / D) / share_i comes first, ties to the lowest
  // index.
  __extension__ using Wide = __int128;
  const Wide d = 2 * static_cast<Wide>(k) - 2;
  const Wide t = Wide{position_} + 1;
  size_t best = k;
  Wide best_numerator = 0, best_units = 1;  // the best deadline, numerator / units, times total_units_ / D
  for (size_t i = 0; i < k; ++i) {
    const Wide lag = Wide{units_[i]} * t - Wide{counts_[i]} * Wide{total_units_};
    if (d * lag < Wide{total_units_}) continue;
    const Wide numerator = d * (Wide{counts_[i]} + 1) - 1;
    if (best == k || numerator * best_units < best_numerator * Wide{units_[i]}) {
      best = i;
      best_numerator = numerator;
      best_units = units_[i];
    }
  }
  MT_CHECK(best < k, "a source whose lag allows a draw (the lags sum to one row)");
  return best;
}

MixtureRow MixtureDraw::next() {
  const size_t source = pick();
  const uint64_t source_row = counts_[source];
  const uint64_t rows = rows_per_epoch_[source];
  ++counts_[source];
  ++position_;
  return {source, source_row, source_row / rows, source_row % rows};
}

void MixtureDraw::restore(const std::vector<uint64_t>& counts, const std::string& where) {
  if (counts.size() != counts_.size()) {
    fail(where, "row counts for the mixture's " + std::to_string(counts_.size()) + " sources",
         std::to_string(counts.size()) + " counts",
         "resume with the dataset_path the checkpoint was made with, or use a fresh run_dir");
  }
  counts_ = counts;
  position_ = 0;
  for (uint64_t count : counts_) position_ += count;
}

void MixtureDraw::seek(uint64_t row) {
  if (row < position_) {
    std::fill(counts_.begin(), counts_.end(), 0);
    position_ = 0;
  }
  while (position_ < row) next();
}

double MixtureDraw::share(size_t source) const {
  return static_cast<double>(units_[source]) / static_cast<double>(total_units_);
}

std::vector<MixtureSourceStats> MixtureDraw::statistics() const {
  std::vector<MixtureSourceStats> stats;
  for (size_t i = 0; i < counts_.size(); ++i) {
    stats.push_back({counts_[i], static_cast<double>(counts_[i]) / static_cast<double>(rows_per_epoch_[i])});
  }
  return stats;
}

}  // namespace meshtrain
