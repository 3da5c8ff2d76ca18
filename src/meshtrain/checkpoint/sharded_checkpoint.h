// Distributed checkpoints (checkpoint format 3): every rank writes the elements it is the saving replica of
// (Engine::local_shard: one replica per element) to its own file, all ranks at once, and the lead rank then
// writes one index from global tensors to chunks. Tensors keep the names and global shapes of the run's
// layout (checkpoint/checkpoint_layout.h: per layer, or stacked with the layer axis at param_scan_axis); a
// chunk is one rank's box of one tensor. Any mesh, in either layout, reads any other's by boxes.
//
// In a checkpoint directory (checkpoint.h has the rest and the commit protocol):
//   shards/rank_00003.safetensors   rank 3's chunks, one safetensors tensor each (named as the global tensor,
//                                   shaped as the box; __metadata__ format meshtrain-shard, rank)
//   shards/rank_00003.json          their list, written after the shard; both fsynced before the rank
//                                   reports done; merged into index.json and removed by the lead
//   index.json                      every tensor: global dims and chunks {file, offset (bytes into the file),
//                                   start, dims, crc32c}; every shard file's size. metadata.json lists it
//                                   (size, CRC-32C); the shards are not listed there: each chunk's CRC-32C
//                                   is checked by the rank that reads it
//
// A rank's memory while saving is its own shards (already in the arena) and nothing else; while loading, its
// own shards plus one read buffer of kShardReadBufferBytes (or one row of a chunk, if larger).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

inline constexpr const char* kShardIndexFile = "index.json";
inline constexpr size_t kShardReadBufferBytes = size_t{8} << 20;

// "shards/rank_00003.safetensors": where rank `rank` writes its chunks, relative to the checkpoint.
std::string rank_shard_file(int rank);

// One chunk a rank saves: the box of global tensor `tensor` (of `tensor_dims`) at `start` spanning `dims`,
// taken from `data` as the engine holds it: [layers][outer][inner] elements, written in the checkpoint's
// order [outer][layers][inner] (a stacked tensor's layer axis moves from outermost to param_scan_axis;
// layers = 1 for every other tensor: the same order).
struct ShardChunk {
  std::string tensor;
  std::vector<int64_t> tensor_dims, start, dims;
  const float* data = nullptr;
  int64_t layers = 1, outer = 1, inner = 1;
};

// Writes shards/rank_<rank>.safetensors and .json under `checkpoint`. Throws MeshError naming the file (a
// full disk, ...).
void write_rank_shard(const std::filesystem::path& checkpoint, int rank,
                      const std::vector<ShardChunk>& chunks);

// The lead rank, once every rank has written: merges the ranks' lists into index.json, checking that the
// chunks of each tensor exactly cover it, and removes the lists.
void write_shard_index(const std::filesystem::path& checkpoint, int world_size);

// A committed format-3 checkpoint's index, for reading boxes of its tensors.
class ShardedCheckpoint {
 public:
  // Reads and checks index.json (the caller has checked its size and CRC against metadata.json).
  explicit ShardedCheckpoint(const std::filesystem::path& checkpoint);
  ~ShardedCheckpoint();
  ShardedCheckpoint(ShardedCheckpoint&&) noexcept;

  // Tensor name -> global dims.
  const std::map<std::string, std::vector<int64_t>>& tensors() const { return dims_; }
  // Fills the box of tensor `name` that starts at `start` and spans `dims` (row-major at `out`) from the
  // chunks that overlap it; each of those is read whole, through one fixed buffer, and its CRC-32C checked.
  // A missing or truncated shard file, or a chunk whose CRC differs, is a MeshError naming the file.
  void read_box(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& dims,
                float* out) const;
  // Several boxes of one tensor at once (the layers of a stacked tensor): each overlapping chunk is read
  // once for all of them.
  struct Box {
    std::vector<int64_t> start, dims;
    float* out = nullptr;  // row-major [dims]
  };
  void read_boxes(const std::string& name, const std::vector<Box>& boxes) const;
  // Bytes read from shard files so far (tests: a rank reads only the chunks it needs).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Chunk {
    std::string file;
    uint64_t offset = 0;
    std::vector<int64_t> start, dims;
    uint32_t crc32c = 0;
  };
  struct OpenFile;
  int descriptor(const std::string& file) const;  // opened on first use, its size checked

  std::filesystem::path directory_;
  std::map<std::string, std::vector<int64_t>> dims_;
  std::map<std::string, std::vector<Chunk>> chunks_;
  std::map<std::string, uint64_t> file_bytes_;
  mutable std::map<std::string, std::unique_ptr<OpenFile>> open_;
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace meshtrain
