// data/mixture: dataset_path's mixture forms and their bad inputs; the draw's shares (within Tijdeman's bound
// 1 - 1 / (2k - 2) of share x n at every n over 10,000 rows, k up to 8), its order against
// tests/reference/mixture/draw_order.py, its determinism, save / restore and seek; per-source epochs and
// their orders (EpochShuffle, shared with token windows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/data/mixture.h"
#include "meshtrain/data/shuffle.h"

namespace meshtrain {
namespace {

using testing::error_of;

std::vector<double> shares_of(const std::string& dataset_path) {
  std::vector<double> shares;
  for (const MixtureSource& source : parse_dataset_path(dataset_path)) shares.push_back(source.share);
  return shares;
}

MixtureDraw draw_of(const std::string& dataset_path, uint64_t rows_per_epoch = 1000) {
  const std::vector<double> shares = shares_of(dataset_path);
  return MixtureDraw(shares, std::vector<uint64_t>(shares.size(), rows_per_epoch));
}

std::string sources_drawn(MixtureDraw& draw, int rows) {
  std::string order;
  for (int n = 0; n < rows; ++n) order += static_cast<char>('0' + draw.next().source);
  return order;
}

TEST(MixtureParse, APlainPathStaysOneSourceAsWritten) {
  for (const std::string text : {"", "data/corpus.tokens", "a,b", "data/x,1", " spaced path ", "[a, b]"}) {
    const auto sources = parse_dataset_path(text);
    ASSERT_EQ(sources.size(), 1u) << text;
    EXPECT_EQ(sources[0].path, text);
    EXPECT_EQ(sources[0].share, 1.0);
  }
}

TEST(MixtureParse, StringFormNormalisesWeightsToShares) {
  const auto sources = parse_dataset_path(" data/web*.jsonl.zst , 3 ;data/{a,b}/*.jsonl,1");
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].path, "data/web*.jsonl.zst");
  EXPECT_EQ(sources[1].path, "data/{a,b}/*.jsonl");  // split at the last comma: the pattern keeps its own
  EXPECT_EQ(sources[0].weight, 3.0);
  EXPECT_EQ(sources[1].weight, 1.0);
  EXPECT_DOUBLE_EQ(sources[0].share, 0.75);
  EXPECT_DOUBLE_EQ(sources[1].share, 0.25);
  EXPECT_DOUBLE_EQ(parse_dataset_path("a,1e308;b,1e308")[0].share, 0.5);  // no overflow in the sum
}

TEST(MixtureParse, ListFormTakesNumbersOrTextWeights) {
  const auto sources = parse_dataset_path(
      R"( [ {"path": "data/web", "weight": 0.7}, {"weight": "0.3", "path": "data/code"}])");
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].path, "data/web");
  EXPECT_EQ(sources[1].path, "data/code");
  EXPECT_DOUBLE_EQ(sources[0].share, 0.7);
  EXPECT_DOUBLE_EQ(sources[1].share, 0.3);
  EXPECT_EQ(parse_dataset_path(R"([{"path": "only", "weight": 2}])").size(), 1u);
}

TEST(MixtureParse, AYamlListUnderDatasetPathArrivesAsTheMixture) {
  const std::string path = (std::filesystem::temp_directory_path() / "meshtrain_mixture_list.yaml").string();
  std::ofstream(path) << "model_name: qwen3-tiny\ndataset_path:\n  - {path: data/web, weight: 3}\n"
                         "  - path: data/code\n    weight: 1\n";
  const auto sources = parse_dataset_path(load_config(path, {}).dataset_path);
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[1].path, "data/code");
  EXPECT_DOUBLE_EQ(sources[0].share, 0.75);
  std::ofstream(path)
      << "model_name: qwen3-tiny\ndataset_path:\n  - {path: data/web, weight: 3}\n  - {path: b}\n";
  const std::string message = error_of([&] { parse_dataset_path(load_config(path, {}).dataset_path); });
  EXPECT_NE(message.find("config key 'dataset_path', entry 2 of 2 ('{\"path\":\"b\"}'): expected the fields "
                         "path and weight, found no weight"),
            std::string::npos)
      << message;
}

TEST(MixtureParse, BadEntriesNameTheKeyTheEntryAndTheFix) {
  struct Case {
    std::string text, entry, found;
  };
  const std::vector<Case> cases = {
      {"a,0;b,1", "entry 1 of 2 ('a,0')", "found '0'"},
      {"a,1;b,-2", "entry 2 of 2 ('b,-2')", "found '-2'"},
      {"a,x;b,1", "entry 1 of 2 ('a,x')", "found 'x'"},
      {"a,nan;b,1", "entry 1 of 2", "found 'nan'"},
      {"a,inf;b,1", "entry 1 of 2", "found 'inf'"},
      {"a,1e999;b,1", "entry 1 of 2", "found '1e999'"},
      {"a,0.5kg;b,1", "entry 1 of 2", "found '0.5kg'"},
      {"a,1;", "entry 2 of 2 ('')", "found an empty entry"},
      {"a,1;;b,1", "entry 2 of 3", "found an empty entry"},
      {"a;b,1", "entry 1 of 2 ('a')", "found no ',' and weight"},
      {" ,1;b,1", "entry 1 of 2 (',1')", "found no pattern before the ','"},
      {"a,;b,1", "entry 1 of 2 ('a,')", "found ''"},
      {R"([{"path": "a"}])", "entry 1 of 1", "found no weight"},
      {R"([{"weight": 1}])", "entry 1 of 1", "found no path"},
      {R"([{"path": "a", "wieght": 1}])", "entry 1 of 1", "did you mean 'weight'?"},
      {R"([{"path": "", "weight": 1}])", "entry 1 of 1", "found an empty path"},
      {R"([{"path": 3, "weight": 1}])", "entry 1 of 1", "found 3"},
      {R"([{"path": "a", "weight": 0}])", "entry 1 of 1", "found '0'"},
      {R"([{"path": "a", "weight": "-1"}])", "entry 1 of 1", "found '-1'"},
      {R"([{"path": "a", "weight": [1]}])", "entry 1 of 1", "found '[1]'"},
      {R"([{"path": "a", "weight": 1}, "b"])", "entry 2 of 2", "found a string"},
      {R"([{"path": "a", "weight": 1})", "config key 'dataset_path'", "found unreadable JSON"},
  };
  for (const Case& bad : cases) {
    const std::string message = error_of([&] { parse_dataset_path(bad.text); });
    EXPECT_NE(message.find("config key 'dataset_path'"), std::string::npos) << bad.text << ": " << message;
    EXPECT_NE(message.find(bad.entry), std::string::npos) << bad.text << ": " << message;
    EXPECT_NE(message.find(bad.found), std::string::npos) << bad.text << ": " << message;
    EXPECT_NE(message.find("expected "), std::string::npos) << message;
    EXPECT_NE(message.find("(fix: "), std::string::npos) << message;
  }
  EXPECT_NE(error_of([] { parse_dataset_path("a,0;b,1"); }).find("a positive finite number"),
            std::string::npos);
}

// Tijdeman's bound: every count within 1 - 1 / (2k - 2) of share x n, at every n, for k = 2..8 sources with
// even, uneven and extreme weights (the greatest-sampling-error rule lagged ~1.2 rows at 7 uneven sources).
TEST(MixtureDraw, EveryCountStaysWithinTijdemansBoundOfItsShare) {
  std::vector<std::string> mixtures = {"a,0.5;b,0.3;c,0.2", "a,1;b,1;c,1", "a,0.7;b,0.2;c,0.1",
                                       "a,5;b,3",           "a,1;b,1000",  "a,0.999;b,0.001;c,0.5;d,7"};
  for (int k = 2; k <= 8; ++k) {
    std::string uneven, even;
    for (int i = 0; i < k; ++i) {
      const std::string entry = std::string(1, static_cast<char>('a' + i)) + ",";
      uneven += (i ? ";" : "") + entry + std::to_string((i * 37 + 11) % 23 + 1);
      even += (i ? ";" : "") + entry + "1";
    }
    mixtures.push_back(uneven);
    mixtures.push_back(even);
  }
  for (const std::string& mixture : mixtures) {
    MixtureDraw draw = draw_of(mixture);
    const double bound = 1.0 - 1.0 / static_cast<double>(2 * draw.sources() - 2);
    double worst = 0;
    for (uint64_t n = 1; n <= 10000; ++n) {
      draw.next();
      for (size_t i = 0; i < draw.sources(); ++i) {
        const double gap =
            std::abs(static_cast<double>(draw.counts()[i]) - draw.share(i) * static_cast<double>(n));
        worst = std::max(worst, gap);
      }
    }
    // The shares are exact to 10^-12; the products of doubles to ~10^-12 relative.
    EXPECT_LE(worst, bound + 1e-6) << mixture;
    EXPECT_EQ(std::accumulate(draw.counts().begin(), draw.counts().end(), uint64_t{0}), 10000u);
  }
  // The draw follows the written shares rounded to 12 decimals.
  const MixtureDraw draw = draw_of("a,0.5;b,0.3;c,0.2");
  EXPECT_NEAR(draw.share(1), 0.3, 1e-12);
}

TEST(MixtureDraw, OrderMatchesTheIndependentReference) {
  // tests/reference/mixture/draw_order.py (exact rationals).
  MixtureDraw uneven = draw_of("a,0.5;b,0.3;c,0.2");
  EXPECT_EQ(sources_drawn(uneven, 40), "0102010210010201021001020102100102010210");
  MixtureDraw thirds = draw_of("a,1;b,1;c,1");
  EXPECT_EQ(sources_drawn(thirds, 40), "0120120120120120120120120120120120120120");
  MixtureDraw pair = draw_of("a,3;b,1");
  EXPECT_EQ(sources_drawn(pair, 40), "0010001000100010001000100010001000100010");
}

TEST(MixtureDraw, IsDeterministicAndRestoresItsState) {
  MixtureDraw first = draw_of("a,0.5;b,0.3;c,0.2", 7);
  MixtureDraw second = draw_of("a,0.5;b,0.3;c,0.2", 7);
  EXPECT_EQ(sources_drawn(first, 5000), sources_drawn(second, 5000));

  MixtureDraw run = draw_of("a,0.45;b,0.35;c,0.2", 7);
  sources_drawn(run, 3777);
  const std::vector<uint64_t> saved = run.counts();
  std::vector<uint64_t> rows_after;
  for (int n = 0; n < 1000; ++n) rows_after.push_back(run.next().source_row);
  const std::vector<uint64_t> counts_after = run.counts();

  MixtureDraw resumed = draw_of("a,0.45;b,0.35;c,0.2", 7);
  resumed.restore(saved, "checkpoint data cursor");
  EXPECT_EQ(resumed.position(), 3777u);
  for (int n = 0; n < 1000; ++n) ASSERT_EQ(resumed.next().source_row, rows_after[static_cast<size_t>(n)]);
  EXPECT_EQ(resumed.counts(), counts_after);

  MixtureDraw sought = draw_of("a,0.45;b,0.35;c,0.2", 7);
  sought.seek(3777);
  EXPECT_EQ(sought.counts(), saved);
  sought.seek(4777);  // forward from the state
  EXPECT_EQ(sought.counts(), counts_after);
  sought.seek(3777);  // back: replayed from row 0
  EXPECT_EQ(sought.counts(), saved);

  const std::string message = error_of([&] { resumed.restore({1, 2}, "checkpoint data cursor"); });
  EXPECT_NE(
      message.find("checkpoint data cursor: expected row counts for the mixture's 3 sources, found 2 counts"),
      std::string::npos)
      << message;
}

TEST(MixtureDraw, SourcesRollIntoNewEpochsAndReportThem) {
  // Source 0 has 4 rows per epoch, source 1 has 10.
  MixtureDraw draw({0.5, 0.5}, {4, 10});
  std::vector<std::vector<MixtureRow>> rows(2);
  for (int n = 0; n < 20; ++n) {
    const MixtureRow row = draw.next();
    rows[row.source].push_back(row);
  }
  ASSERT_EQ(rows[0].size(), 10u);
  for (uint64_t c = 0; c < rows[0].size(); ++c) {
    EXPECT_EQ(rows[0][c].source_row, c);
    EXPECT_EQ(rows[0][c].epoch, c / 4);
    EXPECT_EQ(rows[0][c].index_in_epoch, c % 4);
  }
  EXPECT_EQ(rows[1].back().epoch, 0u);
  EXPECT_EQ(rows[1].back().index_in_epoch, 9u);
  const auto stats = draw.statistics();
  EXPECT_EQ(stats[0].rows, 10u);
  EXPECT_DOUBLE_EQ(stats[0].epochs, 2.5);
  EXPECT_EQ(stats[1].rows, 10u);
  EXPECT_DOUBLE_EQ(stats[1].epochs, 1.0);
}

TEST(MixtureShuffle, EachSourceEpochAndSeedHasItsOwnOrder) {
  const uint64_t rows = 50;
  const auto order = [&](uint64_t seed, size_t source, uint64_t epoch) {
    EpochShuffle shuffle(mixture_source_seed(seed, source), rows);
    return shuffle.permutation(epoch);
  };
  const std::vector<uint64_t> base = order(1234, 0, 0);
  std::vector<uint64_t> sorted = base;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> identity(rows);
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  EXPECT_EQ(sorted, identity);  // a permutation
  EXPECT_NE(base, identity);
  EXPECT_EQ(order(1234, 0, 0), base);  // a pure function of (seed, source, epoch)
  EXPECT_NE(order(1234, 0, 1), base);  // the next epoch reshuffles
  EXPECT_NE(order(1234, 1, 0), base);  // another source
  EXPECT_NE(order(99, 0, 0), base);    // another seed
  EXPECT_NE(mixture_source_seed(1234, 0), 1234u);

  // A source's stream runs through its epochs' orders: position e R + i is entry i of epoch e's order.
  EpochShuffle stream(mixture_source_seed(1234, 0), rows);
  for (uint64_t position = 0; position < 3 * rows; ++position) {
    ASSERT_EQ(stream.row(position), order(1234, 0, position / rows)[position % rows]);
  }
}

}  // namespace
}  // namespace meshtrain
