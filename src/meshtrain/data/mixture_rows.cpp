// MixtureRows: a mixture's global stream over its sources' token windows, its cursor and metrics; the rules
// are in mixture_rows.h.
#include "meshtrain/data/mixture_rows.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;

std::vector<double> shares_of(const std::vector<MixtureSource>& entries) {
  std::vector<double> shares;
  for (const MixtureSource& entry : entries) shares.push_back(entry.share);
  return shares;
}

std::vector<uint64_t> rows_per_epoch_of(const std::vector<std::unique_ptr<TokenWindows>>& sources) {
  std::vector<uint64_t> rows;
  for (const auto& source : sources) rows.push_back(source->rows_per_epoch());
  return rows;
}

constexpr const char* kAllowDataChangeHint =
    "resume with the dataset_path (and data) the checkpoint was made with, set allow_data_change=true to "
    "continue on this data (docs/configuration.md, allow_data_change), or use a fresh run_dir";

}  // namespace

std::unique_ptr<MixtureRows> MixtureRows::open(const std::vector<MixtureSource>& entries,
                                               const std::vector<std::vector<std::string>>& shards,
                                               const LoaderOptions& options, const std::string& key) {
  MT_CHECK(!entries.empty() && entries.size() == shards.size(), "shards for every mixture entry");
  std::vector<std::unique_ptr<TokenWindows>> sources;
  for (size_t i = 0; i < entries.size(); ++i) {
    LoaderOptions source_options = options;
    source_options.seed = mixture_source_seed(options.seed, i);
    sources.push_back(in_mixture_entry(mixture_entry_name(entries, i, key),
                                       [&] { return TokenWindows::open(shards[i], source_options); }));
  }
  return std::unique_ptr<MixtureRows>(new MixtureRows(entries, std::move(sources), options));
}

MixtureRows::MixtureRows(const std::vector<MixtureSource>& entries,
                         std::vector<std::unique_ptr<TokenWindows>> sources, const LoaderOptions& options)
    : entries_(entries),
      sources_(std::move(sources)),
      seed_(options.seed),
      sequence_length_(options.sequence_length),
      packing_(options.packing),
      shuffle_(options.shuffle),
      allow_data_change_(options.allow_data_change),
      draw_(shares_of(entries), rows_per_epoch_of(sources_)) {
  start_.drawn.assign(entries_.size(), 0);
  start_.offsets.assign(entries_.size(), 0);
}

uint64_t MixtureRows::rows_per_epoch() const {
  uint64_t rows = 0;
  for (const auto& source : sources_) rows += source->rows_per_epoch();
  return rows;
}

void MixtureRows::select(int64_t /*step*/, uint64_t first_row, uint64_t rows) {
  if (restart_ || first_row < draw_row_) {
    draw_.restore(start_.drawn, "mixture start");
    draw_row_ = start_.row;
    restart_ = false;
  }
  MT_CHECK(first_row >= draw_row_, "a batch before the mixture's restored position");
  for (; draw_row_ < first_row; ++draw_row_) draw_.next();
  selected_first_row_ = first_row;
  drawn_before_batch_ = draw_.counts();
  selected_.resize(rows);
  for (SelectedRow& selected : selected_) {
    const MixtureRow row = draw_.next();
    ++draw_row_;
    selected = {row.source, sources_[row.source]->window_at(start_.offsets[row.source] + row.source_row)};
  }
}

void MixtureRows::fill_row(uint64_t row, int64_t out_row, Batch& batch) const {
  const SelectedRow& selected = selected_[static_cast<size_t>(row)];
  sources_[selected.source]->fill_window(selected.window, out_row, batch);
}

std::vector<uint64_t> MixtureRows::source_rows() const {
  std::vector<uint64_t> rows(sources_.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = start_.offsets[i] + drawn_before_batch_[i];
  return rows;
}

json MixtureRows::source_identity(size_t source) const {
  const TokenWindows& windows = *sources_[source];
  return {{"path", entries_[source].path},
          {"share", draw_.share(source)},
          {"token_count", windows.token_count()},
          {"windows_per_epoch", windows.rows_per_epoch()},
          {"shard_checksums", windows.shard_checksums()}};
}

void MixtureRows::write_cursor(json& cursor, uint64_t rows_consumed) const {
  MT_CHECK(rows_consumed == selected_first_row_, "a cursor at the selected batch");
  cursor["packing"] = packing_;
  cursor["shuffle"] = shuffle_;
  cursor["rows_consumed"] = rows_consumed;
  const std::vector<uint64_t> rows = source_rows();
  json sources = json::array();
  for (size_t i = 0; i < sources_.size(); ++i) {
    json source = source_identity(i);
    source["weight"] = entries_[i].weight;
    source["rows"] = rows[i];
    source["drawn"] = drawn_before_batch_[i];
    sources.push_back(std::move(source));
  }
  cursor["sources"] = std::move(sources);
}

std::optional<uint64_t> MixtureRows::read_cursor(const json& cursor, const std::string& where) const {
  check_cursor_order(cursor, packing_, shuffle_, where);
  const size_t k = sources_.size();
  const bool mixture_cursor = cursor.contains("sources");
  const auto rows_consumed =
      cursor_field<uint64_t>(cursor, mixture_cursor ? "rows_consumed" : "windows_consumed", where);
  Start start{rows_consumed, std::vector<uint64_t>(k, 0), std::vector<uint64_t>(k, 0)};
  const json saved = mixture_cursor ? cursor_field<json>(cursor, "sources", where) : json::array();
  if (!saved.is_array()) {
    fail(where, "a data cursor whose 'sources' is a list", saved.type_name(),
         "the checkpoint's data cursor is damaged or from another meshtrain version");
  }
  if (!allow_data_change_) {
    if (!mixture_cursor || saved.size() != k) {
      fail(where, "a data cursor of this run's mixture of " + std::to_string(k) + " sources (dataset_path)",
           mixture_cursor ? "a mixture of " + std::to_string(saved.size()) + " sources" : "one source",
           kAllowDataChangeHint);
    }
    uint64_t drawn_total = 0;
    for (size_t i = 0; i < k; ++i) {
      const json mine = source_identity(i);
      for (const auto& [field, value] : mine.items()) {
        const json theirs = saved[i].contains(field) ? saved[i][field] : json();
        // Shares are compared as the draw rounds them: 0.7 / 0.3 and 7 / 3 draw alike.
        if (theirs != value) {
          fail(where + ", " + mixture_entry_name(entries_, i),
               field + " = " + value.dump() + " (this run's data)",
               theirs.dump() + " (when the checkpoint was saved)", kAllowDataChangeHint);
        }
      }
      const auto rows = cursor_field<uint64_t>(saved[i], "rows", where);
      start.drawn[i] = cursor_field<uint64_t>(saved[i], "drawn", where);
      if (start.drawn[i] > rows) fail(where, "a source's drawn rows <= its rows", saved[i].dump());
      start.offsets[i] = rows - start.drawn[i];
      drawn_total += start.drawn[i];
    }
    if (drawn_total > rows_consumed) {
      fail(where, "the sources' drawn rows within rows_consumed " + std::to_string(rows_consumed),
           std::to_string(drawn_total), "the checkpoint's data cursor is damaged");
    }
  } else {
    for (size_t i = 0; i < k; ++i) {
      for (const json& source : saved) {
        if (source.is_object() && source.value("path", "") == entries_[i].path) {
          start.offsets[i] = cursor_field<uint64_t>(source, "rows", where);
        }
      }
    }
  }
  start_ = std::move(start);
  restart_ = true;
  return rows_consumed;
}

json MixtureRows::metrics() const {
  // Through the selected batch: the draw's counts once it has drawn the batch's rows.
  std::vector<uint64_t> rows(sources_.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = start_.offsets[i] + draw_.counts()[i];
  json sources = json::object();
  for (size_t i = 0; i < sources_.size(); ++i) {
    sources["source" + std::to_string(i)] = {
        {"path", entries_[i].path},
        {"rows", rows[i]},
        {"tokens", rows[i] * static_cast<uint64_t>(sequence_length_)},
        {"epochs", static_cast<double>(rows[i]) / static_cast<double>(sources_[i]->rows_per_epoch())}};
  }
  return {{"sources", sources}};
}

}  // namespace meshtrain
