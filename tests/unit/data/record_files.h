// A scratch folder per test for the record readers' tests, and the real gzip / zstd tools to compress into
// it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace meshtrain::testing {

class RecordFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / ("meshtrain_records_" + std::to_string(::getpid()) + "_" +
                                                     info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path file = dir_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file.string();
  }

  static bool have_tool(const std::string& tool) {
    return std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) == 0;
  }

  // `source` compressed by `tool` ("gzip -n" or "zstd -q") into `name`; the tool's exit status must be 0.
  std::string compress(const std::string& tool, const std::string& source, const std::string& name) const {
    const std::string out = path(name);
    const std::string command = tool + " -c '" + source + "' > '" + out + "'";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return out;
  }

  std::filesystem::path dir_;
};

// Skips the test, naming the Debian package, when a compression tool is absent.
#define MESHTRAIN_NEEDS_TOOL(tool)                                                                       \
  do {                                                                                                   \
    if (!have_tool(tool)) GTEST_SKIP() << "the '" tool "' program is absent (apt-get install " tool ")"; \
  } while (0)

}  // namespace meshtrain::testing
