// Tests for Hugging Face weight folders: a sharded round trip named and indexed as transformers does it, a
// single-file folder, layout switches, and every way a folder can disagree with its index.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/io/safetensors_folder.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

class SafetensorsFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_safetensors_folder_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }

  // Writes the folder of tensors z.embed [16] F32 (64 bytes), b.ids [8] I32 (32), m.norm [32] BF16 (64) and
  // a.big [40] F32 (160), values from `seed`.
  std::vector<std::string> write_folder(uint64_t max_shard_bytes, float seed = 0.0f) {
    SafetensorsFolderWriter writer(dir_.string(),
                                   {{"z.embed", "F32", {16}},
                                    {"b.ids", "I32", {8}},
                                    {"m.norm", "BF16", {2, 16}},
                                    {"a.big", "F32", {40}}},
                                   {{"format", "pt"}}, max_shard_bytes);
    const std::vector<float> values = ramp(40, seed);
    const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
    writer.write_raw("b.ids", ids.data());
    writer.write_f32("a.big", 0, 1, 40, 40, values.data());
    writer.write_f32("m.norm", 0, 2, 8, 16, values.data());  // the columns' halves, as two pieces
    writer.write_f32("m.norm", 8, 2, 8, 16, values.data() + 16);
    writer.write_f32("z.embed", 0, 1, 16, 16, values.data());
    writer.commit();
    return writer.file_names();
  }
  static std::vector<float> ramp(size_t count, float seed) {
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = seed + static_cast<float>(i) * 0.5f;  // exact in bf16
    return values;
  }

  fs::path dir_;
};

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

void expect_error_naming(const std::string& message, const std::vector<std::string>& needles) {
  EXPECT_FALSE(message.empty()) << "no MeshError";
  for (const std::string& needle : needles)
    EXPECT_TRUE(contains(message, needle)) << needle << " not in: " << message;
}

TEST_F(SafetensorsFolderTest, ShardedRoundTripNamesAndIndexesAsTransformers) {
  // 128-byte shards: z.embed + b.ids (96); m.norm would pass 128, so a second shard; a.big (160) is larger
  // than the limit and gets the third alone.
  const std::vector<std::string> names = write_folder(128);
  const std::vector<std::string> expected_names = {"model-00001-of-00003.safetensors",
                                                   "model-00002-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors"};
  EXPECT_EQ(names, expected_names);
  std::vector<std::string> on_disk = expected_names;
  on_disk.push_back("model.safetensors.index.json");
  EXPECT_EQ(files(), on_disk);

  std::ifstream in(path("model.safetensors.index.json"));
  const std::string index((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(index,
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 320\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a.big\": \"model-00003-of-00003.safetensors\",\n"
            "    \"b.ids\": \"model-00001-of-00003.safetensors\",\n"
            "    \"m.norm\": \"model-00002-of-00003.safetensors\",\n"
            "    \"z.embed\": \"model-00001-of-00003.safetensors\"\n"
            "  }\n"
            "}\n");

  const SafetensorsFolder folder = SafetensorsFolder::open(dir_.string());
  EXPECT_TRUE(folder.sharded());
  EXPECT_EQ(folder.directory(), dir_.string());
  EXPECT_EQ(folder.tensor_names(), (std::vector<std::string>{"a.big", "b.ids", "m.norm", "z.embed"}));
  ASSERT_EQ(folder.files().size(), 3u);
  for (const SafetensorsFile& file : folder.files()) {
    EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}})) << file.path();
  }
  EXPECT_EQ(folder.file_of("z.embed").path(), path(expected_names[0]));
  EXPECT_EQ(folder.file_of("b.ids").entries().size(), 2u);
  const auto [file, entry] = folder.find("m.norm");
  ASSERT_TRUE(file != nullptr && entry != nullptr);
  EXPECT_EQ(file->path(), path(expected_names[1]));
  EXPECT_EQ(entry->dtype, "BF16");
  EXPECT_EQ(folder.find("absent").file, nullptr);

  const std::vector<float> values = ramp(40, 0.0f);
  std::vector<float> out(40);
  folder.file_of("a.big").read_f32("a.big", {40}, out.data());
  EXPECT_EQ(out, values);
  // m.norm's first halves of both rows came from values[0, 16), the second halves from values[16, 32).
  std::vector<float> norm(32), expected_norm(32);
  for (size_t row = 0; row < 2; ++row) {
    for (size_t col = 0; col < 16; ++col)
      expected_norm[row * 16 + col] = values[(col / 8) * 16 + row * 8 + col % 8];
  }
  folder.file_of("m.norm").read_f32("m.norm", {2, 16}, norm.data());
  EXPECT_EQ(norm, expected_norm);
  std::vector<int32_t> ids(8);
  folder.file_of("b.ids").read_i32("b.ids", {8}, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(SafetensorsFolderTest, WithinTheLimitWritesOneModelSafetensors) {
  EXPECT_EQ(write_folder(320), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});
  const SafetensorsFolder folder = SafetensorsFolder::open(dir_.string());
  EXPECT_FALSE(folder.sharded());
  EXPECT_EQ(folder.tensor_names().size(), 4u);
  EXPECT_EQ(folder.file_of("a.big").path(), path("model.safetensors"));
}

TEST_F(SafetensorsFolderTest, RewritingInTheOtherLayoutRemovesTheStaleFiles) {
  write_folder(320, 1.0f);
  write_text("model-00007-of-00009.safetensors", "stale");  // from some older save
  write_text("notes.txt", "kept");
  write_folder(128, 2.0f);
  EXPECT_EQ(files(), (std::vector<std::string>{
                         "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors", "model.safetensors.index.json", "notes.txt"}));
  std::vector<float> out(40);
  SafetensorsFolder::open(dir_.string()).file_of("a.big").read_f32("a.big", {40}, out.data());
  EXPECT_EQ(out, ramp(40, 2.0f));
  write_folder(1000, 3.0f);
  EXPECT_EQ(files(), (std::vector<std::string>{"model.safetensors", "notes.txt"}));
  SafetensorsFolder::open(dir_.string()).file_of("a.big").read_f32("a.big", {40}, out.data());
  EXPECT_EQ(out, ramp(40, 3.0f));
}

TEST_F(SafetensorsFolderTest, WriterPublishesNothingUnlessEveryShardIsComplete) {
  {
    SafetensorsFolderWriter writer(dir_.string(), {{"a", "F32", {4}}, {"b", "F32", {4}}}, {}, 16);
    const std::vector<float> values(4, 1.0f);
    writer.write_f32("a", 0, 1, 4, 4, values.data());
    expect_error_naming(error_of([&] { writer.write_raw("c", values.data()); }), {dir_.string(), "'c'"});
    expect_error_naming(error_of([&] { writer.commit(); }),
                        {path("model-00002-of-00002.safetensors"), "'b'", "0 of 4 elements"});
  }
  EXPECT_TRUE(files().empty());
}

// ---------------------------------------------------------------------------------------------------------------
// Folders that disagree with themselves

class SafetensorsFolderErrorTest : public SafetensorsFolderTest {
 protected:
  void SetUp() override {
    SafetensorsFolderTest::SetUp();
    const std::vector<float> values(4, 1.0f);
    // s1 holds x [2] and y [2], s2 holds z [2]: 24 bytes.
    write_safetensors(path("s1.safetensors"),
                      {{"x", "F32", {2}, values.data()}, {"y", "F32", {2}, values.data()}}, {});
    write_safetensors(path("s2.safetensors"), {{"z", "F32", {2}, values.data()}}, {});
  }
  void write_index(const std::string& weight_map, const std::string& total_size = "24") const {
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": " + total_size + "}, \"weight_map\": {" + weight_map + "}}");
  }
  std::string open_error() const {
    return error_of([&] { SafetensorsFolder::open(dir_.string()); });
  }
  std::string index() const { return path("model.safetensors.index.json"); }
  static constexpr const char* kGood =
      R"("x": "s1.safetensors", "y": "s1.safetensors", "z": "s2.safetensors")";
};

TEST_F(SafetensorsFolderErrorTest, AGoodIndexOpens) {
  write_index(kGood);
  const SafetensorsFolder folder = SafetensorsFolder::open(dir_.string());
  EXPECT_EQ(folder.tensor_names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(folder.file_of("z").path(), path("s2.safetensors"));
  expect_error_naming(error_of([&] { folder.file_of("w"); }), {dir_.string(), "'w'", "no such tensor"});
}

TEST_F(SafetensorsFolderErrorTest, IndexThatIsNotJsonOrHasNoWeightMap) {
  write_text("model.safetensors.index.json", "{\"weight_map\": {");
  expect_error_naming(open_error(), {index(), "valid JSON", "weight_map"});
  write_text("model.safetensors.index.json", R"({"metadata": {"total_size": 24}})");
  expect_error_naming(open_error(), {index(), "no \"weight_map\""});
  write_text("model.safetensors.index.json", R"({"weight_map": ["s1.safetensors"]})");
  expect_error_naming(open_error(), {index(), "weight_map [\"s1.safetensors\"] (array)"});
}

TEST_F(SafetensorsFolderErrorTest, MissingShardNamesTheShardAndATensorMappedToIt) {
  write_index(std::string(kGood) + R"(, "w": "s3.safetensors")");
  expect_error_naming(open_error(), {path("s3.safetensors"), index(), "'w'", "no such file"});
}

TEST_F(SafetensorsFolderErrorTest, TensorMappedToAShardThatDoesNotHoldIt) {
  write_index(R"("x": "s1.safetensors", "y": "s1.safetensors", "z": "s1.safetensors")");
  expect_error_naming(open_error(), {path("s1.safetensors"), "'z'", index(), "no such tensor"});
  write_index(R"("x": "s2.safetensors", "y": "s1.safetensors", "z": "s2.safetensors")");
  expect_error_naming(open_error(), {path("s2.safetensors"), "'x'", "it is in " + path("s1.safetensors")});
}

TEST_F(SafetensorsFolderErrorTest, TensorHeldByTwoShards) {
  const std::vector<float> values(2, 1.0f);
  write_safetensors(path("s2.safetensors"),
                    {{"x", "F32", {2}, values.data()}, {"z", "F32", {2}, values.data()}}, {});
  write_index(kGood, "32");
  expect_error_naming(open_error(),
                      {index(), "'x'", path("s1.safetensors"), path("s2.safetensors"), "one shard"});
}

TEST_F(SafetensorsFolderErrorTest, TensorInAShardThatTheIndexDoesNotList) {
  write_index(R"("x": "s1.safetensors", "z": "s2.safetensors")");
  expect_error_naming(open_error(), {path("s1.safetensors"), "'y'", index(), "does not list"});
}

TEST_F(SafetensorsFolderErrorTest, FolderWithNeitherFileOrBoth) {
  expect_error_naming(open_error(), {path("model.safetensors"), index(), "neither"});
  expect_error_naming(error_of([&] { SafetensorsFolder::open(path("absent")); }),
                      {path("absent"), "no such folder"});
  write_index(kGood);
  fs::copy_file(path("s1.safetensors"), path("model.safetensors"));
  expect_error_naming(open_error(), {path("model.safetensors"), index(), "both"});
}

TEST_F(SafetensorsFolderErrorTest, ShardPathEscapingTheFolder) {
  write_index(std::string(kGood) + R"(, "w": "../s1.safetensors")");
  expect_error_naming(open_error(), {index(), "'w'", "'../s1.safetensors'", "inside " + dir_.string()});
  write_index(std::string(kGood) + R"(, "w": "/etc/passwd")");
  expect_error_naming(open_error(), {index(), "'w'", "'/etc/passwd'"});
}

TEST_F(SafetensorsFolderErrorTest, TotalSizeThatIsNotTheTensorsBytes) {
  write_index(kGood, "25");
  expect_error_naming(open_error(), {index(), "total_size", "24", "found 25"});
  write_index(kGood, "\"24\"");
  expect_error_naming(open_error(), {index(), "total_size", "whole number"});
  write_index(kGood, "24.0");  // some writers emit a float: a whole one is accepted
  EXPECT_EQ(open_error(), "");
}

TEST_F(SafetensorsFolderErrorTest, TruncatedShardIsNamed) {
  write_index(kGood);
  fs::resize_file(path("s2.safetensors"), fs::file_size(path("s2.safetensors")) - 4);
  expect_error_naming(open_error(), {path("s2.safetensors"), "'z'", "truncated"});
}

}  // namespace
}  // namespace meshtrain
