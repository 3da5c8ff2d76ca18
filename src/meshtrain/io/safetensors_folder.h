// Hugging Face weight folders: one model.safetensors, or shards listed by model.safetensors.index.json.
// A reader that opens and cross-checks every shard against the index, and a streaming writer that shards
// as transformers' save_pretrained does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/io/safetensors.h"

namespace meshtrain {

constexpr const char* kSafetensorsSingleFile = "model.safetensors";
constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";
// transformers' default max_shard_size ("5GB", decimal).
constexpr uint64_t kHfMaxShardBytes = 5'000'000'000;

// Where a tensor of a folder lives; both null when the folder has no such tensor.
struct SafetensorsLocation {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

// A weight folder whose files were all opened (memory-mapped, validated) once and checked against each other:
// with an index, every tensor it lists is in the shard it names, no tensor is in two shards, and no shard
// holds a tensor the index does not list.
class SafetensorsFolder {
 public:
  // Reads `directory`/model.safetensors or, when the folder has only the index, the shards it lists. Every
  // error names the index or shard file (and the tensor), what was expected and what was found.
  static SafetensorsFolder open(const std::string& directory);

  SafetensorsLocation find(const std::string& tensor) const;
  std::vector<std::string> tensor_names() const;  // sorted
  // The file holding `tensor`; fails naming the folder and the tensor when there is none.
  const SafetensorsFile& file_of(const std::string& tensor) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }  // shards in order of file name
  const std::string& directory() const { return directory_; }
  bool sharded() const { return sharded_; }

 private:
  SafetensorsFolder() = default;

  std::string directory_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> file_index_;  // tensor -> position in files_
};

// Writes a folder's weights in pieces (as SafetensorsWriter does a file): one model.safetensors when the
// tensors' bytes are at most `max_shard_bytes`, otherwise shards model-00001-of-0000N.safetensors (tensors
// in the given order, a new shard whenever the next tensor would take the current one past the limit, so a
// tensor larger than the limit gets a shard of its own) and model.safetensors.index.json as transformers
// writes it. `metadata` goes into every file's __metadata__ (transformers writes {"format": "pt"}).
// Nothing is published before commit(); a writer destroyed without commit leaves no new file behind.
class SafetensorsFolderWriter {
 public:
  SafetensorsFolderWriter(std::string directory, std::vector<SafetensorsTensorSpec> tensors,
                          const std::map<std::string, std::string>& metadata,
                          uint64_t max_shard_bytes = kHfMaxShardBytes);

  // SafetensorsWriter's writes, routed to the file that holds tensor `name`.
  void write_f32(const std::string& name, int64_t start, int64_t blocks, int64_t block, int64_t stride,
                 const float* data);
  void write_raw(const std::string& name, const void* data);
  // Checks every file is complete before publishing any, commits the files, writes the index last, then
  // removes what an earlier save of the other layout left (a stale model.safetensors, index or shard), as
  // transformers does, so the folder reads back as exactly what was written. Files are published one by
  // one: write into a fresh folder when a crash half-way must not mix old and new shards.
  void commit();

  const std::string& directory() const { return directory_; }
  bool sharded() const { return !index_text_.empty(); }
  std::vector<std::string> file_names() const;  // in shard order
  // The index as it will be written ("" when not sharded).
  const std::string& index_text() const { return index_text_; }

 private:
  SafetensorsWriter& writer_of(const std::string& name);
  void remove_stale_files() const;

  std::string directory_;
  std::vector<SafetensorsWriter> writers_;
  std::map<std::string, size_t> writer_index_;  // tensor -> position in writers_
  std::string index_text_;
  bool committed_ = false;
};

}  // namespace meshtrain
