// core/durable_file: a write replaces the file whole or not at all, leaves no temporary behind, and its
// errors name the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class DurableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshtrain_durable_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {})); }

  fs::path dir_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(DurableFileTest, WriteCreatesThenReplacesTheWholeFile) {
  const std::string file = path("a.txt");
  write_file_atomically(file, "first version\n");
  EXPECT_EQ(read_text(file), "first version\n");
  write_file_atomically(file, "second\n");
  EXPECT_EQ(read_text(file), "second\n");
  EXPECT_EQ(entries(), 1u) << "a temporary file was left behind";
}

TEST_F(DurableFileTest, WriteAtFillsAHeaderAfterTheBody) {
  const std::string file = path("shard.bin");
  DurableFile out(file);
  out.write_at("body", 4, 4);
  out.write_at("head", 4, 0);
  EXPECT_FALSE(fs::exists(file)) << "the file is visible before commit";
  out.commit();
  EXPECT_EQ(read_text(file), "headbody");
}

TEST_F(DurableFileTest, AppendWritesInOrder) {
  const std::string file = path("parts.bin");
  DurableFile out(file);
  out.append("one ");
  out.append(std::string_view("two"));
  out.commit();
  EXPECT_EQ(read_text(file), "one two");
}

TEST_F(DurableFileTest, AbandonedWriteKeepsTheOldFileAndRemovesTheTemporary) {
  const std::string file = path("kept.txt");
  write_file_atomically(file, "old\n");
  {
    DurableFile out(file);
    out.append("new but never committed\n");
  }
  EXPECT_EQ(read_text(file), "old\n");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(DurableFileTest, MissingFolderIsAnErrorNamingTheFile) {
  const std::string file = path("no/such/folder/x.txt");
  try {
    write_file_atomically(file, "x");
    ADD_FAILURE() << "no error";
  } catch (const MeshError& error) {
    EXPECT_EQ(error.context().where, file);
    EXPECT_NE(std::string(error.what()).find("No such file or directory"), std::string::npos) << error.what();
  }
}

TEST_F(DurableFileTest, FsyncOfAMissingDirectoryIsAnError) {
  EXPECT_THROW(fsync_directory(path("missing")), MeshError);
  EXPECT_NO_THROW(fsync_directory(dir_.string()));
}

}  // namespace
}  // namespace meshtrain
