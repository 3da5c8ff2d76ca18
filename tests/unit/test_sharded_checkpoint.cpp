// checkpoint/sharded_checkpoint: a box of a tensor read from an index of chunks laid out as different meshes
// would save them (rows split, columns split, both), only from the chunks that overlap it; and damaged
// indexes refused with the file named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/checkpoint/sharded_checkpoint.h"
#include "meshtrain/core/crc32c.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Tensor "w" [5, 7] with element (r, c) = 10 r + c, in four chunks over two shard files; "s" a 0-d tensor.
class ShardedIndex : public ::testing::Test {
 protected:
  struct Box {
    std::vector<int64_t> start, dims;
    int file;
  };
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_sharded_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "shards");
    const std::vector<Box> boxes = {{{0, 0}, {3, 4}, 0}, {{0, 4}, {3, 3}, 1}, {{3, 0}, {2, 7}, 0}};
    std::vector<std::vector<float>> files(2);
    json chunks = json::array();
    for (const Box& box : boxes) {
      std::vector<float> values;
      for (int64_t r = 0; r < box.dims[0]; ++r)
        for (int64_t c = 0; c < box.dims[1]; ++c)
          values.push_back(static_cast<float>(10 * (box.start[0] + r) + box.start[1] + c));
      std::vector<float>& file = files[static_cast<size_t>(box.file)];
      chunks.push_back({{"file", name(box.file)},
                        {"offset", file.size() * sizeof(float)},
                        {"start", box.start},
                        {"dims", box.dims},
                        {"crc32c", crc32c(values.data(), values.size() * sizeof(float))}});
      file.insert(file.end(), values.begin(), values.end());
      chunk_bytes_.push_back(values.size() * sizeof(float));
    }
    const float scalar = 2.5f;
    json scalar_chunk = {{"file", name(1)},
                         {"offset", files[1].size() * sizeof(float)},
                         {"start", json::array()},
                         {"dims", json::array()},
                         {"crc32c", crc32c(&scalar, sizeof scalar)}};
    files[1].push_back(scalar);
    index_ = {{"format", "meshtrain-sharded-checkpoint"},
              {"version", 1},
              {"tensors",
               {{"w", {{"dims", {5, 7}}, {"chunks", chunks}}},
                {"s", {{"dims", json::array()}, {"chunks", json::array({scalar_chunk})}}}}},
              {"files", json::object()}};
    for (int f = 0; f < 2; ++f) {
      std::ofstream(dir_ / name(f), std::ios::binary)
          .write(reinterpret_cast<const char*>(files[static_cast<size_t>(f)].data()),
                 static_cast<std::streamsize>(files[static_cast<size_t>(f)].size() * sizeof(float)));
      index_["files"][name(f)] = {{"bytes", files[static_cast<size_t>(f)].size() * sizeof(float)}};
    }
    write_index(index_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string name(int file) { return "shards/rank_0000" + std::to_string(file) + ".safetensors"; }
  void write_index(const json& index) const { std::ofstream(dir_ / kShardIndexFile) << index.dump(); }
  std::string error_opening() const {
    return testing::error_of([&] { ShardedCheckpoint checkpoint(dir_); });
  }

  fs::path dir_;
  json index_;
  std::vector<uint64_t> chunk_bytes_;
};

TEST_F(ShardedIndex, ReadsABoxFromTheChunksThatOverlapIt) {
  const ShardedCheckpoint checkpoint(dir_);
  EXPECT_EQ(checkpoint.tensors().at("w"), (std::vector<int64_t>{5, 7}));
  // Boxes as other meshes hold them: whole, a row block across two chunks, a column block across all three,
  // one element, and a box inside a single chunk.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes = {
      {{0, 0}, {5, 7}}, {{1, 0}, {2, 7}}, {{0, 3}, {5, 2}}, {{4, 6}, {1, 1}}, {{3, 1}, {2, 3}}};
  for (const auto& [start, dims] : boxes) {
    std::vector<float> out(static_cast<size_t>(dims[0] * dims[1]), -1.0f);
    checkpoint.read_box("w", start, dims, out.data());
    for (int64_t r = 0; r < dims[0]; ++r)
      for (int64_t c = 0; c < dims[1]; ++c)
        EXPECT_EQ(out[static_cast<size_t>(r * dims[1] + c)],
                  10.0f * static_cast<float>(start[0] + r) + static_cast<float>(start[1] + c))
            << "box at " << start[0] << "," << start[1] << " element " << r << "," << c;
  }
  // Only overlapping chunks are read: the last box lies inside the third chunk.
  const ShardedCheckpoint fresh(dir_);
  std::vector<float> out(6);
  fresh.read_box("w", {3, 1}, {2, 3}, out.data());
  EXPECT_EQ(fresh.bytes_read(), chunk_bytes_[2]);
  float scalar = 0.0f;
  fresh.read_box("s", {}, {}, &scalar);
  EXPECT_EQ(scalar, 2.5f);

  // Several boxes at once (a stacked tensor's layers): rows 0, 1 and 4, each a box one row deep; every chunk
  // is read once, though the first two chunks hold two of the boxes each.
  const ShardedCheckpoint batched(dir_);
  std::vector<std::vector<float>> rows(3, std::vector<float>(7, -1.0f));
  const std::vector<int64_t> row_index = {0, 1, 4};
  std::vector<ShardedCheckpoint::Box> row_boxes;
  for (size_t i = 0; i < rows.size(); ++i) row_boxes.push_back({{row_index[i], 0}, {1, 7}, rows[i].data()});
  batched.read_boxes("w", row_boxes);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t c = 0; c < 7; ++c)
      EXPECT_EQ(rows[i][static_cast<size_t>(c)],
                10.0f * static_cast<float>(row_index[i]) + static_cast<float>(c))
          << "row " << row_index[i] << " column " << c;
  }
  EXPECT_EQ(batched.bytes_read(), chunk_bytes_[0] + chunk_bytes_[1] + chunk_bytes_[2]);
}

TEST_F(ShardedIndex, DamagedIndexesNameTheFile) {
  json outside = index_;
  outside["tensors"]["w"]["chunks"][1]["start"] = {0, 5};  // ends past column 7
  write_index(outside);
  std::string message = error_opening();
  EXPECT_TRUE(contains(message, "index.json: tensor 'w'")) << message;
  EXPECT_TRUE(contains(message, "inside its dims [5, 7]")) << message;

  json gap = index_;
  gap["tensors"]["w"]["chunks"].erase(2);
  write_index(gap);
  message = error_opening();
  EXPECT_TRUE(contains(message, "chunks covering its 35 elements, found 21 elements in chunks")) << message;

  // The right element count, but two chunks share column 3 and column 6 of rows 0-2 is nobody's.
  json overlapping = index_;
  overlapping["tensors"]["w"]["chunks"][1]["start"] = {0, 3};
  write_index(overlapping);
  message = error_opening();
  EXPECT_TRUE(contains(message, "expected chunks that do not overlap")) << message;
  EXPECT_TRUE(contains(message, "[0, 0] of [3, 4] and at [0, 3] of [3, 3] share elements")) << message;

  json elsewhere = index_;
  elsewhere["files"]["../../etc/passwd"] = {{"bytes", 4}};
  write_index(elsewhere);
  message = error_opening();
  EXPECT_TRUE(contains(message, "shard files named shards/rank_NNNNN.safetensors")) << message;

  std::ofstream(dir_ / kShardIndexFile) << "{\"format\": ";
  message = error_opening();
  EXPECT_TRUE(contains(message, "index.json: expected the checkpoint index meshtrain writes")) << message;

  write_index(index_);
  {  // a flipped byte in a chunk: its CRC-32C, naming the file and tensor
    std::fstream file(dir_ / name(0), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(5);
    file.put('\x7f');
  }
  const ShardedCheckpoint checkpoint(dir_);
  std::vector<float> out(35);
  message = testing::error_of([&] { checkpoint.read_box("w", {0, 0}, {5, 7}, out.data()); });
  EXPECT_TRUE(contains(message, "shards/rank_00000.safetensors: expected CRC-32C")) << message;
  EXPECT_TRUE(contains(message, "chunk of tensor 'w' at byte 0")) << message;
}

// Found by tests/fuzz/fuzz_checkpoint_index: a float where the index has an integer was converted with
// undefined behaviour (3.3e107 into an int64_t), and starts, sizes and offsets near 2^63 overflowed the
// checks meant to reject them. Each is now an error naming the index and the tensor.
TEST_F(ShardedIndex, NumbersOutsideTheirRangeAreDamageNamingTheTensor) {
  const auto message_with = [&](const std::function<void(json&)>& damage) {
    json damaged = index_;
    damage(damaged);
    write_index(damaged);
    return error_opening();
  };
  const int64_t max = std::numeric_limits<int64_t>::max();
  std::string message =
      message_with([](json& index) { index["tensors"]["w"]["chunks"][1]["start"][1] = 3.3e107; });
  EXPECT_TRUE(contains(message, "index.json: tensor 'w': expected chunk start as an integer from 0 to"))
      << message;
  EXPECT_TRUE(contains(message, "found 3.3e+107 (number)")) << message;
  message = message_with([](json& index) { index["tensors"]["w"]["dims"][0] = -5; });
  EXPECT_TRUE(contains(message, "expected dims as an integer from 0")) << message;
  message = message_with([](json& index) { index["tensors"]["w"]["chunks"][0]["crc32c"] = 1ull << 32; });
  EXPECT_TRUE(contains(message, "expected chunk crc32c as an integer from 0 to 4294967295")) << message;
  message = message_with([](json& index) { index["files"][name(0)]["bytes"] = "12"; });
  EXPECT_TRUE(contains(message, "index.json: file 'shards/rank_00000.safetensors': expected bytes"))
      << message;
  // A start near 2^63 plus the chunk's size wrapped around and passed as inside the tensor.
  message = message_with([&](json& index) {
    json chunk = index["tensors"]["w"]["chunks"][0];
    chunk["start"] = {0, max};
    chunk["dims"] = {1, 3};
    index["tensors"]["w"] = {{"dims", {1, max}}, {"chunks", json::array({chunk})}};
  });
  EXPECT_TRUE(contains(message, "index.json: tensor 'w': expected chunks inside its dims")) << message;
  // An offset whose byte count wrapped past 2^64 and passed as inside the file.
  message =
      message_with([](json& index) { index["tensors"]["w"]["chunks"][1]["offset"] = ~uint64_t{0} - 3; });
  EXPECT_TRUE(contains(message, "inside a listed shard file")) << message;
  // Dims whose product does not fit in 64 bits.
  message = message_with([](json& index) { index["tensors"]["w"]["dims"] = {1ll << 40, 1ll << 40}; });
  EXPECT_TRUE(contains(message, "index.json: tensor 'w': expected a tensor of at most 2^63 - 1 elements"))
      << message;
  write_index(index_);
  EXPECT_EQ(error_opening(), "");
}

}  // namespace
}  // namespace meshtrain
