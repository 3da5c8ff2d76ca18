// A mixture of weighted sources in dataset_path, and the deterministic draw of which source each row of the
// global stream comes from.
//
// Forms of dataset_path (parse_dataset_path):
//  - MaxText's grain_train_files string, any text holding a ';': "pattern,weight;pattern,weight". Each entry
//    is split at its last ',' (a pattern may hold commas); blanks around the pattern and weight are dropped.
//  - A list of {path, weight}: a text starting with '[' and then '{', JSON ('[{"path": "a", "weight": 0.7},
//    ...]'). A YAML list of mappings under dataset_path arrives as this text (the config layer writes it,
//    every value a string), so a weight may be a number or a string holding one.
//  - Anything else is one source whose path is the whole text, exactly as before mixtures existed (empty
//    included: the default corpus of dataset_type=text).
// A weight is a positive finite number; weights are normalised to shares (weight / sum of weights): a
// source's share of the packed rows, so of the training tokens.
//
// The draw (MixtureDraw): Tijdeman's chairman-assignment rule (R. Tijdeman, "The chairman assignment
// problem", Discrete Mathematics 32, 1980). With k sources and D = 2k - 2, row t of the global stream
// (t = 1, 2, ...) may come from any source whose count so far is at least 1 / D row below share x t; of
// those it comes from the one whose deadline (count + 1 - 1 / D) / share is earliest, ties to the lowest
// index. Tijdeman proved that after every row every source's count is within 1 - 1 / D of share x t (1/2 row
// for two sources, under one row for any k; tested for k up to 8), which the spec's "within one row" asks.
// Megatron's greatest-sampling-error rule (megatron/core/datasets/helpers.cpp, build_blending_indices: the
// source furthest below its share) was the anchor and the rule here before; it meets one row for two or
// three sources but lags to about 1.2 rows at 7 uneven ones. Both draw a 3:1 mixture as 0,0,1,0 repeated;
// tests/reference/mixture/draw_order.py computes the order independently. The comparisons are exact
// integer arithmetic on the shares rounded to 12 decimals, so every machine draws the same sources, and
// weights written as decimals tie exactly where their decimal values do.
//
// The state is the per-source counts: saved and restored, the draw continues identically. seek() reaches
// any position by replaying from the state (or from 0 for an earlier one).
//
// Source i's rows are its own stream 0, 1, 2, ...: its row c is row c mod R_i of its epoch c / R_i (R_i its
// rows per epoch), and a shuffled source visits epoch e in the order EpochShuffle(mixture_source_seed(seed,
// i), R_i) draws (shuffle.h), so each (seed, source, epoch) has its own order. MixtureRows (mixture_rows.h)
// is the rows a training run reads through this draw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain {

struct MixtureSource {
  std::string path;   // a file, a folder or a glob, as written
  double weight = 1;  // as written
  double share = 1;   // weight / the sum of the weights
};

// dataset_path's sources: one for a plain path (weight and share 1), else the mixture's entries in the
// order written. A malformed mixture is a MeshError naming config key 'dataset_path' and the entry.
std::vector<MixtureSource> parse_dataset_path(const std::string& text);

// How errors name a mixture's entry: "config key 'KEY', entry i of k ('path')" (i from 1).
std::string mixture_entry_name(const std::vector<MixtureSource>& entries, size_t index,
                               const std::string& key = "dataset_path");

// Runs `body`; a MeshError from it is rethrown with `entry` (mixture_entry_name's) before its own where, so
// an error in one source's files names the mixture entry they came from.
template <class Body>
decltype(auto) in_mixture_entry(const std::string& entry, Body&& body) {
  try {
    return body();
  } catch (const MeshError& error) {
    const ErrorContext& context = error.context();
    fail(entry + ": " + context.where, context.expected, context.found, context.hint);
  }
}

// The seed mixture source `source` shuffles its rows with: its epochs' orders differ from every other
// source's and from the seed's own.
uint64_t mixture_source_seed(uint64_t seed, size_t source);

// Where a row of the global stream comes from.
struct MixtureRow {
  size_t source = 0;
  uint64_t source_row = 0;      // the source's stream position: rows drawn from it before this one
  uint64_t epoch = 0;           // source_row / the source's rows per epoch
  uint64_t index_in_epoch = 0;  // source_row mod the source's rows per epoch (before its epoch's shuffle)
};

// One source's progress, for metrics (its tokens are the loader's to count).
struct MixtureSourceStats {
  uint64_t rows = 0;  // rows drawn from it
  double epochs = 0;  // rows / its rows per epoch: 2.5 is two epochs done and half of the third
};

class MixtureDraw {
 public:
  // `shares`: positive, summing to 1 (parse_dataset_path's); `rows_per_epoch`: each source's, positive.
  MixtureDraw(const std::vector<double>& shares, std::vector<uint64_t> rows_per_epoch);

  // Draws the source of global row position() and moves on to the next row.
  MixtureRow next();
  uint64_t position() const { return position_; }

  // The state: rows drawn from each source (they sum to position()).
  const std::vector<uint64_t>& counts() const { return counts_; }
  // Continues from saved counts (a MeshError naming `where` when they are for another number of sources).
  void restore(const std::vector<uint64_t>& counts, const std::string& where);
  // Moves to global row `row`: forward from the current state, or replayed from row 0 when behind it.
  void seek(uint64_t row);

  size_t sources() const { return counts_.size(); }
  // The share the draw follows (the given one, rounded to 12 decimals).
  double share(size_t source) const;
  std::vector<MixtureSourceStats> statistics() const;

 private:
  size_t pick() const;

  std::vector<int64_t> units_;  // [k] each share in units of 1 / total_units_
  int64_t total_units_ = 0;
  std::vector<uint64_t> rows_per_epoch_;
  std::vector<uint64_t> counts_;
  uint64_t position_ = 0;
};

}  // namespace meshtrain
