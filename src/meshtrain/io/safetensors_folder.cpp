// Hugging Face weight folders: opening a folder (single file or index + shards, cross-checked) and writing
// one in pieces, sharded and indexed as transformers' save_pretrained does.
#include "meshtrain/io/safetensors_folder.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string join_path(const std::string& directory, const std::string& name) {
  return (fs::path(directory) / name).string();
}

// A JSON value as it appears in the file, shortened so a huge value cannot flood the message.
std::string json_text(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text + " (" + value.type_name() + ")";
}

// A shard name from an index must stay inside the folder: relative, without '..' (a hostile index could
// otherwise make us map any file on the machine). Symlinks are fine: the Hugging Face cache is made of them.
bool stays_inside(const std::string& name) {
  if (name.empty()) return false;
  const fs::path path(name);
  if (path.has_root_path()) return false;
  for (const fs::path& part : path) {
    if (part == "..") return false;
  }
  return true;
}

// The name transformers gives shard `number` (from 1) of `count`: model-00001-of-00003.safetensors.
std::string shard_name(size_t number, size_t count) {
  const auto five_digits = [](size_t n) {
    const std::string digits = std::to_string(n);
    return std::string(digits.size() < 5 ? 5 - digits.size() : 0, '0') + digits;
  };
  return "model-" + five_digits(number) + "-of-" + five_digits(count) + ".safetensors";
}

// Whether `name` has the form of a shard name (model-NNNNN-of-NNNNN.safetensors).
bool is_shard_name(const std::string& name) {
  const std::string example = shard_name(1, 1);
  if (name.size() != example.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool digit = example[i] >= '0' && example[i] <= '9';
    if (digit ? !(name[i] >= '0' && name[i] <= '9') : name[i] != example[i]) return false;
  }
  return true;
}

// metadata.total_size as a byte count. transformers writes an integer; a whole number written as a float is
// accepted too.
uint64_t total_size_of(const json& value, const std::string& index_path) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_float()) {
    const double bytes = value.get<double>();
    if (bytes >= 0 && bytes < 0x1p64 && bytes == static_cast<double>(static_cast<uint64_t>(bytes))) {
      return static_cast<uint64_t>(bytes);
    }
  }
  fail(index_path + ": metadata.total_size", "a non-negative whole number of bytes", json_text(value));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Reading

SafetensorsFolder SafetensorsFolder::open(const std::string& directory) {
  SafetensorsFolder folder;
  folder.directory_ = directory;
  const std::string single_path = join_path(directory, kSafetensorsSingleFile);
  const std::string index_path = join_path(directory, kSafetensorsIndexFile);
  std::error_code error;
  const bool has_single = fs::exists(single_path, error);
  const bool has_index = fs::exists(index_path, error);
  if (!has_single && !has_index) {
    fail(directory, "a Hugging Face weight folder holding " + single_path + " or " + index_path,
         fs::is_directory(directory, error) ? "neither file" : "no such folder",
         "point at the folder save_pretrained wrote (the one with config.json)");
  }
  if (has_single && has_index) {
    // transformers would quietly load model.safetensors; either file may be the stale one.
    fail(directory, "one of " + single_path + " or " + index_path, "both",
         "remove the one an earlier save left behind");
  }

  if (has_single) {
    folder.files_.push_back(SafetensorsFile::open(single_path));
    for (const SafetensorsEntry& entry : folder.files_[0].entries()) folder.file_index_[entry.name] = 0;
    return folder;
  }

  folder.sharded_ = true;
  const std::string shape_hint =
      "an index of the form {\"metadata\": {\"total_size\": N}, \"weight_map\": {tensor: shard file}}";
  json index;
  try {
    index = json::parse(read_file_text(index_path, "index file"));
  } catch (const json::exception& parse_error) {
    fail(index_path, shape_hint + " in valid JSON", parse_error.what(), "re-download or re-save the model");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    fail(index_path, shape_hint,
         !index.is_object()              ? json_text(index)
         : !index.contains("weight_map") ? "no \"weight_map\""
                                         : "weight_map " + json_text(index["weight_map"]),
         "re-download or re-save the model");
  }

  // Each shard, with the first tensor (by name) the index maps to it, for messages.
  std::map<std::string, std::string> shards;
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    const std::string where = tensor_where(index_path, tensor);
    if (!shard.is_string()) fail(where, "a shard file name (a string)", json_text(shard));
    const std::string name = shard.get<std::string>();
    if (!stays_inside(name)) {
      fail(where, "a shard file inside " + directory, "'" + name + "'",
           "shard names are plain file names such as model-00001-of-00002.safetensors");
    }
    weight_map[tensor] = name;
    shards.emplace(name, tensor);
  }

  std::map<std::string, size_t> shard_position;  // shard name -> position in files_
  for (const auto& [name, tensor] : shards) {
    const std::string path = join_path(directory, name);
    if (!fs::exists(path, error)) {
      fail(path, "the shard " + index_path + " maps tensor '" + tensor + "' to", "no such file",
           "download the missing shard, or re-save the model");
    }
    shard_position[name] = folder.files_.size();
    folder.files_.push_back(SafetensorsFile::open(path));  // its errors name the shard's path
  }

  for (size_t i = 0; i < folder.files_.size(); ++i) {
    for (const SafetensorsEntry& entry : folder.files_[i].entries()) {
      const auto [held, inserted] = folder.file_index_.emplace(entry.name, i);
      if (!inserted) {
        fail(tensor_where(index_path, entry.name), "each tensor in one shard",
             "the tensor in both " + folder.files_[held->second].path() + " and " + folder.files_[i].path(),
             "the folder disagrees with its index: remove the stale shard or re-save the model");
      }
    }
  }
  for (const auto& [tensor, name] : weight_map) {
    const SafetensorsFile& shard = folder.files_[shard_position.at(name)];
    if (shard.find(tensor) == nullptr) {
      const auto held = folder.file_index_.find(tensor);
      fail(tensor_where(shard.path(), tensor), "the tensor, since " + index_path + " maps it to this shard",
           "no such tensor among its " + std::to_string(shard.entries().size()) + " tensors" +
               (held == folder.file_index_.end() ? ""
                                                 : " (it is in " + folder.files_[held->second].path() + ")"),
           "re-download the shard, or re-save the model");
    }
  }
  for (const SafetensorsFile& shard : folder.files_) {
    for (const SafetensorsEntry& entry : shard.entries()) {
      if (weight_map.count(entry.name) == 0) {
        fail(tensor_where(shard.path(), entry.name), "only tensors that " + index_path + " lists",
             "a tensor the index does not list",
             "the folder disagrees with its index: re-save the model, or add the tensor to weight_map");
      }
    }
  }

  if (index.contains("metadata") && !index["metadata"].is_null()) {
    const json& metadata = index["metadata"];
    if (!metadata.is_object()) fail(index_path + ": metadata", "an object", json_text(metadata));
    if (metadata.contains("total_size")) {
      const uint64_t total_size = total_size_of(metadata["total_size"], index_path);
      uint64_t bytes = 0;
      for (const SafetensorsFile& shard : folder.files_) {
        for (const SafetensorsEntry& entry : shard.entries()) bytes += entry.end - entry.begin;
      }
      if (total_size != bytes) {
        fail(index_path + ": metadata.total_size",
             "the tensors' bytes summed over the shards, " + std::to_string(bytes),
             std::to_string(total_size),
             "the index is from another save of the model: re-download or re-save it");
      }
    }
  }
  return folder;
}

SafetensorsLocation SafetensorsFolder::find(const std::string& tensor) const {
  const auto it = file_index_.find(tensor);
  if (it == file_index_.end()) return {};
  const SafetensorsFile& file = files_[it->second];
  return {&file, file.find(tensor)};
}

std::vector<std::string> SafetensorsFolder::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(file_index_.size());
  for (const auto& [name, file] : file_index_) names.push_back(name);
  return names;
}

const SafetensorsFile& SafetensorsFolder::file_of(const std::string& tensor) const {
  const auto it = file_index_.find(tensor);
  if (it == file_index_.end()) {
    fail(tensor_where(directory_, tensor),
         "a tensor among the folder's " + std::to_string(file_index_.size()) + " tensors", "no such tensor",
         "check that the checkpoint matches the model configuration");
  }
  return files_[it->second];
}

// ---------------------------------------------------------------------------------------------------------------
// Writing

SafetensorsFolderWriter::SafetensorsFolderWriter(std::string directory,
                                                 std::vector<SafetensorsTensorSpec> tensors,
                                                 const std::map<std::string, std::string>& metadata,
                                                 uint64_t max_shard_bytes)
    : directory_(std::move(directory)) {
  MT_CHECK(max_shard_bytes > 0, "SafetensorsFolderWriter with a shard limit of 0 bytes");
  // Every tensor is checked before any file is created (each file's writer checks only its own).
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const SafetensorsTensorSpec& tensor : tensors) {
    const uint64_t bytes = safetensors_tensor_bytes(directory_, tensor);
    if (!writer_index_.emplace(tensor.name, 0).second) {
      fail(tensor_where(directory_, tensor.name), "unique tensor names", "the name twice in the tensor list");
    }
    if (bytes > std::numeric_limits<uint64_t>::max() - total) {
      fail(directory_, "a total size that fits in 64 bits", "tensors summing past 2^64 bytes");
    }
    sizes.push_back(bytes);
    total += bytes;
  }

  // Shard boundaries: a new shard whenever the next tensor would take the current one past the limit.
  std::vector<std::vector<SafetensorsTensorSpec>> groups(1);
  uint64_t group_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (total > max_shard_bytes && !groups.back().empty() && group_bytes + sizes[i] > max_shard_bytes) {
      groups.emplace_back();
      group_bytes = 0;
    }
    writer_index_[tensors[i].name] = groups.size() - 1;
    groups.back().push_back(std::move(tensors[i]));
    group_bytes += sizes[i];
  }

  const bool sharded = total > max_shard_bytes;
  std::vector<std::string> names;
  for (size_t g = 0; g < groups.size(); ++g) {
    names.push_back(sharded ? shard_name(g + 1, groups.size()) : kSafetensorsSingleFile);
  }
  if (sharded) {
    // As transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n" (ASCII, keys sorted).
    json weight_map = json::object();
    for (const auto& [tensor, group] : writer_index_) weight_map[tensor] = names[group];
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    try {
      index_text_ = index.dump(2, ' ', true) + "\n";
    } catch (const json::exception& error) {
      fail(join_path(directory_, kSafetensorsIndexFile), "tensor names that are valid UTF-8", error.what());
    }
  }
  writers_.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    writers_.emplace_back(join_path(directory_, names[g]), std::move(groups[g]), metadata);
  }
}

std::vector<std::string> SafetensorsFolderWriter::file_names() const {
  std::vector<std::string> names;
  for (const SafetensorsWriter& writer : writers_)
    names.push_back(fs::path(writer.path()).filename().string());
  return names;
}

SafetensorsWriter& SafetensorsFolderWriter::writer_of(const std::string& name) {
  const auto it = writer_index_.find(name);
  if (it == writer_index_.end()) {
    fail(tensor_where(directory_, name),
         "one of the " + std::to_string(writer_index_.size()) + " tensors the folder was laid out with",
         "no such tensor", "declare every tensor when making the writer");
  }
  return writers_[it->second];
}

void SafetensorsFolderWriter::write_f32(const std::string& name, int64_t start, int64_t blocks, int64_t block,
                                        int64_t stride, const float* data) {
  writer_of(name).write_f32(name, start, blocks, block, stride, data);
}

void SafetensorsFolderWriter::write_raw(const std::string& name, const void* data) {
  writer_of(name).write_raw(name, data);
}

void SafetensorsFolderWriter::commit() {
  MT_CHECK(!committed_, directory_ + " committed twice");
  // All checked before any is published, so a missed write cannot leave half a new folder.
  for (const SafetensorsWriter& writer : writers_) writer.check_complete();
  for (SafetensorsWriter& writer : writers_) writer.commit();
  // The index last: a reader never sees an index naming shards not yet in place.
  if (sharded()) write_file_atomically(join_path(directory_, kSafetensorsIndexFile), index_text_);
  committed_ = true;
  remove_stale_files();
}

void SafetensorsFolderWriter::remove_stale_files() const {
  const std::vector<std::string> written = file_names();
  std::set<std::string> current(written.begin(), written.end());
  if (sharded()) current.insert(kSafetensorsIndexFile);
  std::vector<fs::path> stale;
  std::error_code error;
  for (fs::directory_iterator it(directory_, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (current.count(name) == 0 &&
        (name == kSafetensorsSingleFile || name == kSafetensorsIndexFile || is_shard_name(name))) {
      stale.push_back(it->path());
    }
  }
  if (error) {
    fail(directory_, "a folder whose files can be listed", error.message(),
         "remove the weight files an earlier save left there by hand");
  }
  for (const fs::path& path : stale) {
    if (!fs::remove(path, error) && error) {
      fail(path.string(), "a file left by an earlier save that can be removed",
           "removing it failed: " + error.message(),
           "remove it by hand: the new weights are in place and this file contradicts them");
    }
  }
  if (!stale.empty()) fsync_directory(directory_);
}

}  // namespace meshtrain
