// Progress output: plain lines without '\r' off a terminal, a width-limited redrawn bar on a pseudo
// terminal, ETA from the moving average of step time, and duration formatting.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/metrics/progress.h"

namespace meshtrain {
namespace {

std::string contents(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) text.append(buffer, n);
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    lines.push_back(text.substr(begin, end - begin));
  }
  return lines;
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(format_duration(0.0), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(252.0), "4m12s");
  EXPECT_EQ(format_duration(3599.0), "59m59s");
  EXPECT_EQ(format_duration(3720.0), "1h02m");
  EXPECT_EQ(format_duration(3.0 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(format_duration(-1.0), "--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), ">99d");
  EXPECT_EQ(format_duration(1e300), ">99d");
}

TEST(Progress, FormatLine) {
  EXPECT_EQ(format_progress_line(120, 600, 3.4124, 1843.2, 252.0, 0),
            "step 120/600 20% loss 3.412 | 1843 tok/s | ETA 4m12s");
  EXPECT_EQ(format_progress_line(120, 600, 3.4124, 1843.2, 252.0, 100),
            "step 120/600 [######........................] 20% loss 3.412 | 1843 tok/s | ETA 4m12s");
  EXPECT_EQ(format_progress_line(1, 2, 1.0, 1.0, -1.0, 0), "step 1/2 50% loss 1.000 | 1 tok/s | ETA --");
  // Narrow terminals: the bar shrinks, then goes, then the text is cut; never columns or more.
  for (int columns : {70, 62, 50, 10, 1}) {
    const std::string line = format_progress_line(120, 600, 3.4124, 1843.2, 252.0, columns);
    EXPECT_LT(static_cast<int>(line.size()), std::max(columns, 1)) << columns << ": " << line;
  }
  EXPECT_EQ(format_progress_line(120, 600, 3.4124, 1843.2, 252.0, 50).find('['), std::string::npos);
}

TEST(Progress, PlainLinesOffATerminal) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressBar bar(100, 0, file, /*plain_interval=*/25);
    EXPECT_FALSE(bar.interactive());
    for (int64_t step = 1; step <= 100; ++step) {
      // 10 ms steps: the 10-second rule never fires here.
      bar.update(step, 5.0 - 0.01 * static_cast<double>(step), 1000.0, 0.01 * static_cast<double>(step));
      if (step == 50) bar.message("eval loss 4.2");
    }
    bar.finish();
    bar.update(100, 0.0, 0.0, 99.0);  // ignored after finish
  }
  const std::string text = contents(file);
  std::fclose(file);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  const auto lines = lines_of(text);
  // The first step, every 25 steps after it, the message, and the last step (once, not again at finish).
  ASSERT_EQ(lines.size(), 6u) << text;
  EXPECT_EQ(lines[0], "step 1/100 1% loss 4.990 | 1000 tok/s | ETA --");  // no step time measured yet
  EXPECT_EQ(lines[1], "step 26/100 26% loss 4.740 | 1000 tok/s | ETA 1s");
  EXPECT_EQ(lines[2], "eval loss 4.2");
  EXPECT_EQ(lines[3].rfind("step 51/100 51%", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("step 76/100 76%", 0), 0u) << lines[4];
  EXPECT_EQ(lines[5], "step 100/100 100% loss 4.000 | 1000 tok/s | ETA 0s");
}

TEST(Progress, ABarOverOtherWorkDrawsItsOwnLine) {
  EXPECT_EQ(format_bar_line("read 3/10 MB", 0.3, " 30% | 2 docs", 0), "read 3/10 MB 30% | 2 docs");
  EXPECT_EQ(format_bar_line("read", 0.5, " half", 30), "read [########.........] half");
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    // Bytes as the work: 1000 of them, updates every 100.
    ProgressBar bar(1000, file, [](int64_t done, int64_t total, double eta_seconds, int columns) {
      return format_bar_line(std::to_string(done) + "/" + std::to_string(total) + " bytes", 0.0,
                             " ETA " + format_duration(eta_seconds), columns);
    });
    for (int64_t bytes = 100; bytes <= 1000; bytes += 100)
      bar.advance(bytes, 0.1 * static_cast<double>(bytes));
  }
  const std::vector<std::string> lines = lines_of(contents(file));
  std::fclose(file);
  ASSERT_EQ(lines.size(), 10u);  // a line every 50 bytes' worth: each update
  EXPECT_EQ(lines.front(), "100/1000 bytes ETA --");
  EXPECT_EQ(lines[1], "200/1000 bytes ETA 1m20s");  // 0.1 s a byte, 800 left
  EXPECT_EQ(lines.back(), "1000/1000 bytes ETA 0s");
}

TEST(Progress, PlainLinesAtLeastEveryTenSeconds) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressBar bar(10, 0, file, /*plain_interval=*/1000);
    for (int64_t step = 1; step <= 10; ++step) bar.update(step, 1.0, 1.0, 3.0 * static_cast<double>(step));
  }
  const auto lines = lines_of(contents(file));
  std::fclose(file);
  // 3 s steps: step 1 (first), 5 (12 s later), 9 (12 s later), 10 (last).
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1].rfind("step 5/10", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("step 9/10", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("step 10/10", 0), 0u) << lines[3];
}

TEST(Progress, EtaFollowsMovingAverageOfStepTime) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBar bar(100, 40, file);  // resumed at step 40
  EXPECT_LT(bar.eta_seconds(), 0.0);
  bar.update(41, 1.0, 1.0, 1000.0);  // first update: start-up time before it is not a step time
  EXPECT_LT(bar.eta_seconds(), 0.0);
  bar.update(42, 1.0, 1.0, 1002.0);
  EXPECT_DOUBLE_EQ(bar.eta_seconds(), 2.0 * 58);
  bar.update(43, 1.0, 1.0, 1006.0);  // mean of 2 s and 4 s
  EXPECT_DOUBLE_EQ(bar.eta_seconds(), 3.0 * 57);
  bar.update(45, 1.0, 1.0, 1012.0);  // two steps in 6 s: 3 s each
  EXPECT_DOUBLE_EQ(bar.eta_seconds(), 3.0 * 55);
  bar.finish();
  std::fclose(file);
}

// A pseudo terminal stands in for a console: the bar is redrawn with '\r' and fits its width.
TEST(Progress, RedrawsOneLineOnATerminal) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) GTEST_SKIP() << "no pseudo terminals";
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  winsize size{};
  size.ws_col = 60;
  size.ws_row = 20;
  ASSERT_EQ(ioctl(slave, TIOCSWINSZ, &size), 0);
  const char* old_term = std::getenv("TERM");
  const std::string saved_term = old_term != nullptr ? old_term : "";
  setenv("TERM", "xterm", 1);
  std::FILE* stream = fdopen(slave, "w");
  ASSERT_NE(stream, nullptr);
  {
    ProgressBar bar(600, 0, stream);
    EXPECT_TRUE(bar.interactive());
    for (int64_t step = 1; step <= 3; ++step) bar.update(step, 3.4, 1843.0, static_cast<double>(step));
    bar.message("checkpoint saved");
    bar.finish();
  }
  std::fclose(stream);
  if (old_term != nullptr)
    setenv("TERM", saved_term.c_str(), 1);
  else
    unsetenv("TERM");

  std::string text;
  char buffer[4096];
  ASSERT_EQ(fcntl(master, F_SETFL, O_NONBLOCK), 0);
  for (ssize_t n; (n = read(master, buffer, sizeof(buffer))) > 0;) text.append(buffer, n);
  close(master);
  // The terminal turns "\n" into "\r\n"; drop that so only the bar's own '\r's split the text.
  for (size_t at; (at = text.find("\r\n")) != std::string::npos;) text.replace(at, 2, "\n");
  EXPECT_NE(text.find("\rstep 3/600 ["), std::string::npos) << text;
  EXPECT_NE(text.find("\r\x1b[Kcheckpoint saved\n"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');  // finish() ends the bar's line
  size_t segments = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find_first_of("\r\n", begin);
    if (end == std::string::npos) end = text.size();
    std::string segment = text.substr(begin, end - begin);
    if (const size_t clear = segment.find("\x1b[K"); clear != std::string::npos) segment.erase(clear);
    EXPECT_LT(segment.size(), 60u) << segment;
    segments += segment.empty() ? 0 : 1;
    begin = end + 1;
  }
  EXPECT_GE(segments, 5u);  // three updates, the message, the redraw after it
}

}  // namespace
}  // namespace meshtrain
