#include "meshtrain/checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/json_number.h"
#include "meshtrain/core/tensor.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kShardFolder = "shards";
constexpr const char* kIndexFormat = "meshtrain-sharded-checkpoint";
const std::string kEarlierCheckpoint =
    "the checkpoint was damaged after it was written; use an earlier checkpoint";

std::string rank_stem(int rank) {
  char text[32];
  std::snprintf(text, sizeof text, "rank_%05d", rank);
  return text;
}

int64_t volume(const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t size : dims) count *= size;
  return count;
}

// The non-negative integers of an index field ("dims", "start"), each checked (json_number.h).
std::vector<int64_t> index_dims(const json& values, const std::string& where, const std::string& what) {
  if (!values.is_array()) fail(where, what + " as a list of integers", values.dump(), kEarlierCheckpoint);
  std::vector<int64_t> dims;
  for (const json& value : values) {
    dims.push_back(
        json_integer(value, 0, std::numeric_limits<int64_t>::max(), where, what, kEarlierCheckpoint));
  }
  return dims;
}

// Elements of a tensor of `dims` read from an index; more than 2^63 - 1 is damage.
int64_t index_volume(const std::vector<int64_t>& dims, const std::string& where) {
  int64_t count = 1;
  for (int64_t size : dims) {
    if (__builtin_mul_overflow(count, size, &count)) {
      fail(where, "a tensor of at most 2^63 - 1 elements", "dims " + dims_text(dims), kEarlierCheckpoint);
    }
  }
  return count;
}

}  // namespace

std::string rank_shard_file(int rank) {
  return std::string(kShardFolder) + "/" + rank_stem(rank) + ".safetensors";
}

void write_rank_shard(const fs::path& checkpoint, int rank, const std::vector<ShardChunk>& chunks) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const ShardChunk& chunk : chunks) {
    MT_CHECK(chunk.layers * chunk.outer * chunk.inner == volume(chunk.dims),
             "a chunk's order of its own size");
    specs.push_back({chunk.tensor, "F32", chunk.dims});
  }
  SafetensorsWriter shard((checkpoint / rank_shard_file(rank)).string(), specs,
                          {{"format", "meshtrain-shard"}, {"rank", std::to_string(rank)}});
  json listed = json::array();
  for (const ShardChunk& chunk : chunks) {
    // Engine order [layers][outer][inner] into the file's [outer][layers][inner], and the CRC-32C of the
    // bytes as the file holds them. With more than one layer and outer row the order changes: whole outer
    // rows are reordered through a buffer of about kShardReadBufferBytes and written as one run each time
    // (writing each layer's runs in place would be `outer` writes of `inner` floats per layer: 4 bytes each
    // for a stacked norm scale).
    uint32_t crc = 0;
    const int64_t total = volume(chunk.dims);
    if (chunk.layers == 1 || chunk.outer == 1) {
      shard.write_f32(chunk.tensor, 0, 1, total, total, chunk.data);
      crc = crc32c(chunk.data, static_cast<size_t>(total) * sizeof(float), crc);
    } else {
      const int64_t per_outer = chunk.layers * chunk.inner;  // one outer row in file order
      const int64_t outer_per_write =
          std::max<int64_t>(1, static_cast<int64_t>(kShardReadBufferBytes / sizeof(float)) / per_outer);
      std::vector<float> reordered(static_cast<size_t>(std::min(chunk.outer, outer_per_write) * per_outer));
      for (int64_t first = 0; first < chunk.outer; first += outer_per_write) {
        const int64_t count = std::min(outer_per_write, chunk.outer - first);
        for (int64_t o = 0; o < count; ++o) {
          for (int64_t layer = 0; layer < chunk.layers; ++layer) {
            std::memcpy(reordered.data() + (o * chunk.layers + layer) * chunk.inner,
                        chunk.data + (layer * chunk.outer + first + o) * chunk.inner,
                        static_cast<size_t>(chunk.inner) * sizeof(float));
          }
        }
        shard.write_f32(chunk.tensor, first * per_outer, 1, count * per_outer, count * per_outer,
                        reordered.data());
        crc = crc32c(reordered.data(), static_cast<size_t>(count * per_outer) * sizeof(float), crc);
      }
    }
    listed.push_back({{"tensor", chunk.tensor},
                      {"tensor_dims", chunk.tensor_dims},
                      {"offset", shard.data_start() + shard.find(chunk.tensor)->begin},
                      {"start", chunk.start},
                      {"dims", chunk.dims},
                      {"crc32c", crc}});
  }
  shard.commit();  // fsynced and in place before its list says it is complete
  uint64_t bytes = 0;
  {
    std::error_code error;
    bytes = fs::file_size(checkpoint / rank_shard_file(rank), error);
    if (error) fail((checkpoint / rank_shard_file(rank)).string(), "the shard just written", error.message());
  }
  write_file_atomically(
      (checkpoint / kShardFolder / (rank_stem(rank) + ".json")).string(),
      json{{"file", rank_shard_file(rank)}, {"bytes", bytes}, {"chunks", listed}}.dump() + "\n");
}

void write_shard_index(const fs::path& checkpoint, int world_size) {
  json tensors = json::object(), files = json::object();
  std::vector<fs::path> lists;
  for (int rank = 0; rank < world_size; ++rank) {
    const fs::path list_path = checkpoint / kShardFolder / (rank_stem(rank) + ".json");
    const json list = json::parse(read_file_text(list_path.string(), "rank's list of checkpoint chunks"));
    const std::string file = list.at("file").get<std::string>();
    files[file] = {{"bytes", list.at("bytes")}};
    for (const json& chunk : list.at("chunks")) {
      json& tensor = tensors[chunk.at("tensor").get<std::string>()];
      if (tensor.is_null()) tensor = {{"dims", chunk.at("tensor_dims")}, {"chunks", json::array()}};
      MT_CHECK(tensor["dims"] == chunk.at("tensor_dims"), "ranks disagree on a tensor's global shape");
      tensor["chunks"].push_back({{"file", file},
                                  {"offset", chunk.at("offset")},
                                  {"start", chunk.at("start")},
                                  {"dims", chunk.at("dims")},
                                  {"crc32c", chunk.at("crc32c")}});
    }
    lists.push_back(list_path);
  }
  // Each element has exactly one saving replica, so a tensor's chunks add up to it.
  for (const auto& [name, tensor] : tensors.items()) {
    int64_t covered = 0;
    for (const json& chunk : tensor["chunks"]) covered += volume(chunk["dims"].get<std::vector<int64_t>>());
    MT_CHECK(covered == volume(tensor["dims"].get<std::vector<int64_t>>()),
             "the saved chunks of " + name + " do not cover it");
  }
  const json index = {{"format", kIndexFormat}, {"version", 1}, {"tensors", tensors}, {"files", files}};
  write_file_atomically((checkpoint / kShardIndexFile).string(), index.dump() + "\n");
  for (const fs::path& list : lists) fs::remove(list);
}

// ---- reading ----

struct ShardedCheckpoint::OpenFile {
  int fd = -1;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

ShardedCheckpoint::ShardedCheckpoint(ShardedCheckpoint&&) noexcept = default;
ShardedCheckpoint::~ShardedCheckpoint() = default;

ShardedCheckpoint::ShardedCheckpoint(const fs::path& checkpoint) : directory_(checkpoint) {
  const std::string where = (checkpoint / kShardIndexFile).string();
  try {
    const json index = json::parse(read_file_text(where, "checkpoint index"));
    if (index.at("format") != kIndexFormat || index.at("version") != 1) {
      fail(where, std::string(kIndexFormat) + " version 1",
           index.at("format").dump() + " version " + index.at("version").dump(),
           "load it with the meshtrain version that wrote it");
    }
    for (const auto& [file, entry] : index.at("files").items()) {
      // Only the names a save writes: a damaged index must not send reads elsewhere.
      const std::string suffix = ".safetensors";
      const bool valid =
          file.size() == std::string("shards/rank_00000").size() + suffix.size() &&
          file.starts_with("shards/rank_") && file.ends_with(suffix) &&
          std::all_of(file.begin() + 12, file.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                      [](char c) { return c >= '0' && c <= '9'; });
      if (!valid) {
        fail(where, "shard files named shards/rank_NNNNN.safetensors", "'" + file + "'", kEarlierCheckpoint);
      }
      file_bytes_[file] = json_unsigned(entry.at("bytes"), std::numeric_limits<uint64_t>::max(),
                                        where + ": file '" + file + "'", "bytes", kEarlierCheckpoint);
    }
    for (const auto& [name, tensor] : index.at("tensors").items()) {
      const std::string tensor_where = where + ": tensor '" + name + "'";
      const std::vector<int64_t> dims = index_dims(tensor.at("dims"), tensor_where, "dims");
      const int64_t elements = index_volume(dims, tensor_where);
      for (const json& entry : tensor.at("chunks")) {
        Chunk chunk{
            entry.at("file").get<std::string>(),
            json_unsigned(entry.at("offset"), std::numeric_limits<uint64_t>::max(), tensor_where,
                          "chunk offset", kEarlierCheckpoint),
            index_dims(entry.at("start"), tensor_where, "chunk start"),
            index_dims(entry.at("dims"), tensor_where, "chunk dims"),
            static_cast<uint32_t>(json_unsigned(entry.at("crc32c"), std::numeric_limits<uint32_t>::max(),
                                                tensor_where, "chunk crc32c", kEarlierCheckpoint))};
        // Written so that nothing overflows: every start and size is at most 2^63 - 1.
        bool inside = chunk.start.size() == dims.size() && chunk.dims.size() == dims.size();
        for (size_t d = 0; inside && d < dims.size(); ++d)
          inside =
              chunk.dims[d] > 0 && chunk.start[d] <= dims[d] && chunk.dims[d] <= dims[d] - chunk.start[d];
        const auto file = file_bytes_.find(chunk.file);
        // Inside the tensor, the chunk has at most its elements, so its volume does not overflow.
        if (!inside || file == file_bytes_.end() || chunk.offset > file->second ||
            static_cast<uint64_t>(volume(chunk.dims)) > (file->second - chunk.offset) / sizeof(float)) {
          fail(tensor_where, "chunks inside its dims " + dims_text(dims) + " and inside a listed shard file",
               "a chunk at " + dims_text(chunk.start) + " of " + dims_text(chunk.dims) + " in '" +
                   chunk.file + "'",
               kEarlierCheckpoint);
        }
        chunks_[name].push_back(std::move(chunk));
      }
      // Inside the dims, pairwise disjoint and as many elements as the tensor: every element exactly once
      // (a count alone would let two overlapping chunks hide a gap).
      const std::vector<Chunk>& chunks = chunks_[name];
      for (size_t a = 0; a < chunks.size(); ++a) {
        for (size_t b = a + 1; b < chunks.size(); ++b) {
          bool overlap = true;
          for (size_t d = 0; overlap && d < dims.size(); ++d) {
            overlap = chunks[a].start[d] < chunks[b].start[d] + chunks[b].dims[d] &&
                      chunks[b].start[d] < chunks[a].start[d] + chunks[a].dims[d];
          }
          if (overlap) {
            fail(tensor_where, "chunks that do not overlap",
                 "chunks at " + dims_text(chunks[a].start) + " of " + dims_text(chunks[a].dims) + " and at " +
                     dims_text(chunks[b].start) + " of " + dims_text(chunks[b].dims) + " share elements",
                 kEarlierCheckpoint);
          }
        }
      }
      // Disjoint chunks inside the tensor add up to at most its elements: the sum does not overflow.
      int64_t covered = 0;
      for (const Chunk& chunk : chunks) covered += volume(chunk.dims);
      if (covered != elements) {
        fail(tensor_where, "chunks covering its " + std::to_string(elements) + " elements",
             std::to_string(covered) + " elements in chunks", kEarlierCheckpoint);
      }
      dims_[name] = dims;
    }
  } catch (const json::exception& e) {
    fail(where, "the checkpoint index meshtrain writes (valid JSON)", e.what(), kEarlierCheckpoint);
  }
}

int ShardedCheckpoint::descriptor(const std::string& file) const {
  std::unique_ptr<OpenFile>& open = open_[file];
  if (open) return open->fd;
  const fs::path path = directory_ / file;
  auto opened = std::make_unique<OpenFile>();
  do {
    opened->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (opened->fd < 0 && errno == EINTR);
  if (opened->fd < 0 && (errno == EMFILE || errno == ENFILE)) {
    // Not damage: this process holds one descriptor per shard file it reads from.
    fail(path.string(), "a free file descriptor to open a shard file", std::strerror(errno),
         "raise the open-file limit (ulimit -n; " + std::to_string(open_.size()) + " shard files are open)");
  }
  if (opened->fd < 0) {
    fail(path.string(), "the shard file index.json lists", std::strerror(errno), kEarlierCheckpoint);
  }
  struct stat status {};
  const uint64_t expected = file_bytes_.at(file);
  if (::fstat(opened->fd, &status) != 0 || static_cast<uint64_t>(status.st_size) != expected) {
    fail(path.string(), std::to_string(expected) + " bytes (recorded in index.json)",
         std::to_string(status.st_size) + " bytes: the file is " +
             (static_cast<uint64_t>(status.st_size) < expected ? "truncated" : "longer"),
         kEarlierCheckpoint);
  }
  open = std::move(opened);
  return open->fd;
}

void ShardedCheckpoint::read_box(const std::string& name, const std::vector<int64_t>& start,
                                 const std::vector<int64_t>& dims, float* out) const {
  read_boxes(name, {{start, dims, out}});
}

void ShardedCheckpoint::read_boxes(const std::string& name, const std::vector<Box>& boxes) const {
  const auto found = chunks_.find(name);
  MT_CHECK(found != chunks_.end(), "a box of a tensor the checkpoint has: " + name);
  const size_t rank = dims_.at(name).size();
  for (const Box& box : boxes) {
    MT_CHECK(box.start.size() == rank && box.dims.size() == rank, "a box of tensor " + name + "'s rank");
  }
  const auto overlap = [rank](const Chunk& chunk, const Box& box) {
    bool overlaps = true;
    for (size_t d = 0; d < rank && overlaps; ++d)
      overlaps = chunk.start[d] < box.start[d] + box.dims[d] && box.start[d] < chunk.start[d] + chunk.dims[d];
    return overlaps;
  };
  std::vector<float> buffer;
  std::vector<const Box*> wanting;  // the boxes that overlap the current chunk
  for (const Chunk& chunk : found->second) {
    wanting.clear();
    for (const Box& box : boxes) {
      if (overlap(chunk, box)) wanting.push_back(&box);
    }
    if (wanting.empty()) continue;
    // The chunk is read once, row by row (a row: its last dim; a 0-d tensor is one row of one element), as
    // many rows at a time as the buffer holds; each row's part inside each box is copied out.
    const int64_t row = rank == 0 ? 1 : chunk.dims.back();
    const int64_t rows = volume(chunk.dims) / row;
    const int64_t rows_per_read =
        std::max<int64_t>(1, static_cast<int64_t>(kShardReadBufferBytes / sizeof(float)) / row);
    buffer.resize(static_cast<size_t>(std::min(rows, rows_per_read) * row));
    const int fd = descriptor(chunk.file);
    uint32_t crc = 0;
    std::vector<int64_t> coordinate(rank, 0);  // the current row's position inside the chunk
    for (int64_t first = 0; first < rows; first += rows_per_read) {
      const int64_t count = std::min(rows_per_read, rows - first);
      const size_t bytes = static_cast<size_t>(count * row) * sizeof(float);
      const uint64_t at = chunk.offset + static_cast<uint64_t>(first * row) * sizeof(float);
      for (size_t done = 0; done < bytes;) {
        const ssize_t got = ::pread(fd, reinterpret_cast<char*>(buffer.data()) + done, bytes - done,
                                    static_cast<off_t>(at + done));
        if (got < 0 && errno == EINTR) continue;  // a signal arrived before any byte: read again
        if (got <= 0) {
          fail((directory_ / chunk.file).string(), "a readable shard file",
               got == 0 ? "an early end of file" : std::strerror(errno), kEarlierCheckpoint);
        }
        done += static_cast<size_t>(got);
      }
      crc = crc32c(buffer.data(), bytes, crc);
      bytes_read_ += bytes;
      for (int64_t r = 0; r < count; ++r) {
        for (const Box* box : wanting) {
          // This row's part inside the box: every leading coordinate inside, the last dim clipped.
          bool inside = true;
          int64_t target = 0;  // flat offset in the box of the row's first element, leading dims only
          for (size_t d = 0; d + 1 < rank; ++d) {
            const int64_t global = chunk.start[d] + coordinate[d];
            inside = inside && global >= box->start[d] && global < box->start[d] + box->dims[d];
            target = target * box->dims[d] + (global - box->start[d]);
          }
          if (!inside) continue;
          const int64_t last_start = rank == 0 ? 0 : chunk.start.back();
          const int64_t box_start = rank == 0 ? 0 : box->start.back();
          const int64_t box_size = rank == 0 ? 1 : box->dims.back();
          const int64_t lo = std::max(last_start, box_start);
          const int64_t hi = std::min(last_start + row, box_start + box_size);
          std::memcpy(box->out + target * box_size + (lo - box_start),
                      buffer.data() + r * row + (lo - last_start),
                      static_cast<size_t>(hi - lo) * sizeof(float));
        }
        for (size_t d = rank - (rank > 0 ? 1 : 0); d-- > 0;) {  // next row: odometer over the leading dims
          if (++coordinate[d] < chunk.dims[d]) break;
          coordinate[d] = 0;
        }
      }
    }
    if (crc != chunk.crc32c) {
      fail((directory_ / chunk.file).string(),
           "CRC-32C " + std::to_string(chunk.crc32c) + " for the chunk of tensor '" + name + "' at byte " +
               std::to_string(chunk.offset) + " (recorded in index.json)",
           "CRC-32C " + std::to_string(crc) + ": the file is corrupted", kEarlierCheckpoint);
    }
  }
}

}  // namespace meshtrain
