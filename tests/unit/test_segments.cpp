// The decoder's segments from the config (shared/specs/layers-and-checkpoints.md): the spec's example, the
// presets of every family, and the edges (a group of one layer, no layer to group, Engram on every layer).
#include <gtest/gtest.h>

#include "meshtrain/config/config.h"
#include "meshtrain/model/segments.h"

namespace meshtrain {
namespace {

std::string segments_of(const std::string& preset, const std::vector<std::string>& overrides = {}) {
  return segments_text(decoder_segments(load_config(preset, overrides)));
}

TEST(Segments, TheSpecsDeepSeekStyleExample) {
  // 6 layers, layer 0 dense, Engram on layers 1 and 4, the rest MoE.
  EXPECT_EQ(segments_of("deepseek-custom"), "dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | moe 5..5");
  const std::vector<LayerSegment> segments = decoder_segments(load_config("deepseek-custom", {}));
  ASSERT_EQ(segments.size(), 5u);
  EXPECT_TRUE(segments[0].group);   // a group of one layer is still a group (stacked when scanning)
  EXPECT_FALSE(segments[1].group);  // an Engram layer stands alone: its tables' sizes are its own
  EXPECT_EQ(segments[2].count, 2);
}

TEST(Segments, EveryFamilysPresets) {
  EXPECT_EQ(segments_of("qwen3-0.6b"), "dense 0..27");
  EXPECT_EQ(segments_of("gpt2-124m"), "dense 0..11");
  EXPECT_EQ(segments_of("qwen3-30b-a3b"), "moe 0..47");
  EXPECT_EQ(segments_of("deepseek-v3"), "dense 0..2 | moe 3..60");
  EXPECT_EQ(segments_of("deepseek-custom-tiny"),
            "dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | moe 5..5");
}

TEST(Segments, EdgeCases) {
  EXPECT_EQ(segments_of("qwen3-tiny", {"base_num_decoder_layers=1"}), "dense 0..0");
  EXPECT_EQ(segments_of("qwen3-tiny", {"base_num_decoder_layers=0"}), "");  // nothing to group: no error
  EXPECT_EQ(segments_of("deepseek-custom-tiny", {"engram_layers=[0,1,2,3,4,5]"}),
            "dense+engram 0 | moe+engram 1 | moe+engram 2 | moe+engram 3 | moe+engram 4 | moe+engram 5");
  EXPECT_EQ(segments_of("deepseek-custom-tiny", {"engram_layers=[]", "first_num_dense_layers=6"}),
            "dense 0..5");
  // Every layer is in exactly one segment, in order.
  const std::vector<LayerSegment> segments = decoder_segments(load_config("deepseek-custom", {}));
  int64_t next = 0;
  for (const LayerSegment& segment : segments) {
    EXPECT_EQ(segment.first, next);
    next += segment.count;
  }
  EXPECT_EQ(next, 6);
}

}  // namespace
}  // namespace meshtrain
