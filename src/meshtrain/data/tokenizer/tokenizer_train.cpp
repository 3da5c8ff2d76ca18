// Training a byte-level BPE tokenizer on texts (GPT-2 pre-tokenisation, incremental pair counts) and writing
// any tokenizer as a Hugging Face tokenizer.json.

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/data/tokenizer/tokenizer_impl.h"

namespace meshtrain {
namespace {

using tokenizer_detail::BpeModel;

constexpr int64_t kMaxTrainedVocab = int64_t{1} << 24;  // the loader's id cap

uint64_t pack(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t left_of(uint64_t pair) {
  return static_cast<int32_t>(pair >> 32);
}
int32_t right_of(uint64_t pair) {
  return static_cast<int32_t>(pair & 0xFFFFFFFFu);
}

void check_special_tokens(const std::vector<std::string>& special_tokens) {
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    const std::string& token = special_tokens[i];
    if (token.empty()) {
      fail("special_tokens", "non-empty special tokens", "an empty one at position " + to_text(i));
    }
    if (!tokenizer_detail::is_valid_utf8(token)) {
      fail("special_tokens", "special tokens in valid UTF-8 (tokenizer.json is JSON)",
           "invalid UTF-8 at position " + to_text(i));
    }
    for (size_t j = 0; j < i; ++j) {
      if (special_tokens[j] == token) {
        fail("special_tokens", "distinct special tokens", "'" + token + "' twice");
      }
    }
  }
}

// Pre-token -> how often it occurs. Occurrences of special tokens are cut out first: they become single
// ids when encoding, so merges spent on their pieces would be wasted.
std::unordered_map<std::string_view, int64_t> count_pre_tokens(
    const std::vector<std::string_view>& texts, const std::vector<std::string>& special_tokens) {
  const tokenizer_detail::PreTokenizerRegex regex(tokenizer_detail::kGpt2Pattern, false,
                                                  "tokenizer training");
  std::unordered_map<std::string_view, int64_t> counts;
  std::vector<std::string_view> pieces;
  const auto count_segment = [&](std::string_view segment) {
    pieces.clear();
    regex.split(segment, pieces);
    for (const std::string_view piece : pieces) ++counts[piece];
  };
  for (const std::string_view text : texts) {
    // Next occurrence of each special token at or after `done`; refreshed only once passed, so a text with
    // many separators stays linear.
    std::vector<size_t> next(special_tokens.size());
    for (size_t k = 0; k < special_tokens.size(); ++k) next[k] = text.find(special_tokens[k]);
    size_t done = 0;
    while (true) {
      size_t cut = std::string_view::npos;
      size_t cut_length = 0;
      for (size_t k = 0; k < special_tokens.size(); ++k) {
        if (next[k] < cut ||
            (next[k] == cut && cut != std::string_view::npos && special_tokens[k].size() > cut_length)) {
          cut = next[k];
          cut_length = special_tokens[k].size();
        }
      }
      if (cut == std::string_view::npos) {
        count_segment(text.substr(done));
        break;
      }
      count_segment(text.substr(done, cut - done));
      done = cut + cut_length;
      for (size_t k = 0; k < special_tokens.size(); ++k) {
        if (next[k] != std::string_view::npos && next[k] < done) next[k] = text.find(special_tokens[k], done);
      }
    }
  }
  return counts;
}

struct PairStats {
  int64_t count = 0;
  std::vector<int32_t> words;  // words that held the pair at some point (may hold stale entries)
};

// Merges the text's most frequent pair until `target` tokens exist. Ties go to the pair whose byte strings
// (left, then right) compare smallest, so training is deterministic whatever the hash maps' order.
class BpeTrainer {
 public:
  explicit BpeTrainer(const std::unordered_map<std::string_view, int64_t>& counts) {
    std::vector<std::pair<std::string_view, int64_t>> unique(counts.begin(), counts.end());
    std::sort(unique.begin(), unique.end());
    for (const auto& [piece, count] : unique) {
      if (piece.size() < 2) continue;  // no pairs to count
      std::vector<int32_t> symbols(piece.size());
      for (size_t i = 0; i < piece.size(); ++i) symbols[i] = static_cast<unsigned char>(piece[i]);
      words_.push_back(std::move(symbols));
      frequencies_.push_back(count);
    }
    for (int byte = 0; byte < 256; ++byte) {
      tokens_.emplace_back(1, static_cast<char>(byte));
      token_ids_.emplace(tokens_.back(), byte);
    }
    for (size_t w = 0; w < words_.size(); ++w) {
      const auto& symbols = words_[w];
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        PairStats& stats = pairs_[pack(symbols[i], symbols[i + 1])];
        stats.count += frequencies_[w];
        if (stats.words.empty() || stats.words.back() != static_cast<int32_t>(w)) {
          stats.words.push_back(static_cast<int32_t>(w));
        }
      }
    }
    for (const auto& [pair, stats] : pairs_) heap_.push_back(Entry{stats.count, pair});
    std::make_heap(heap_.begin(), heap_.end(), lower_priority());
  }

  void run(size_t target) {
    while (tokens_.size() < target && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), lower_priority());
      const Entry top = heap_.back();
      heap_.pop_back();
      const auto found = pairs_.find(top.pair);
      const int64_t current = found == pairs_.end() ? 0 : found->second.count;
      if (current != top.count) {
        // Counts only fall without a push; a risen count was pushed when it rose.
        if (current > 0 && current < top.count) push(Entry{current, top.pair});
        continue;
      }
      if (current <= 0) continue;
      merge(top.pair, std::move(found->second.words));
    }
  }

  std::vector<std::string>& tokens() { return tokens_; }
  std::vector<tokenizer_detail::Merge>& merges() { return merges_; }
  bool has_token(const std::string& bytes) const { return token_ids_.count(bytes) != 0; }

 private:
  struct Entry {
    int64_t count;
    uint64_t pair;
  };
  // The heap's order: `a` below `b` when it has a lower count, or the same count and larger byte strings.
  struct LowerPriority {
    const std::vector<std::string>* tokens;
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.count != b.count) return a.count < b.count;
      const std::string& a_left = (*tokens)[left_of(a.pair)];
      const std::string& b_left = (*tokens)[left_of(b.pair)];
      if (a_left != b_left) return a_left > b_left;
      return (*tokens)[right_of(a.pair)] > (*tokens)[right_of(b.pair)];
    }
  };
  LowerPriority lower_priority() const { return LowerPriority{&tokens_}; }
  void push(Entry entry) {
    heap_.push_back(entry);
    std::push_heap(heap_.begin(), heap_.end(), lower_priority());
  }

  void merge(uint64_t pair, std::vector<int32_t> affected) {
    const int32_t left = left_of(pair);
    const int32_t right = right_of(pair);
    std::string bytes = tokens_[left] + tokens_[right];
    int32_t merged = 0;
    // Two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"); the second reuses the token.
    if (const auto existing = token_ids_.find(bytes); existing != token_ids_.end()) {
      merged = existing->second;
    } else {
      merged = static_cast<int32_t>(tokens_.size());
      tokens_.push_back(bytes);
      token_ids_.emplace(std::move(bytes), merged);
    }
    merges_.push_back(tokenizer_detail::Merge{left, right, merged});

    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    deltas_.clear();
    new_pairs_.clear();
    for (const int32_t w : affected) {
      std::vector<int32_t>& symbols = words_[w];
      bool holds = false;
      for (size_t i = 0; i + 1 < symbols.size() && !holds; ++i) {
        holds = symbols[i] == left && symbols[i + 1] == right;
      }
      if (!holds) continue;  // a stale entry: an earlier merge took the pair out of this word
      const int64_t frequency = frequencies_[w];
      // Take every pair of the word out and put the merged word's back; the unchanged pairs cancel below.
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        deltas_.emplace_back(pack(symbols[i], symbols[i + 1]), -frequency);
      }
      size_t out = 0;
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          symbols[out++] = merged;
          i += 2;
        } else {
          symbols[out++] = symbols[i++];
        }
      }
      symbols.resize(out);
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const uint64_t key = pack(symbols[i], symbols[i + 1]);
        deltas_.emplace_back(key, frequency);
        if (symbols[i] == merged || symbols[i + 1] == merged) new_pairs_.emplace_back(key, w);
      }
    }
    std::sort(deltas_.begin(), deltas_.end());
    for (size_t i = 0; i < deltas_.size();) {
      const uint64_t key = deltas_[i].first;
      int64_t delta = 0;
      for (; i < deltas_.size() && deltas_[i].first == key; ++i) delta += deltas_[i].second;
      if (delta == 0) continue;
      PairStats& stats = pairs_[key];
      stats.count += delta;
      if (delta > 0) push(Entry{stats.count, key});
    }
    for (const auto& [key, w] : new_pairs_) {
      std::vector<int32_t>& words = pairs_[key].words;
      if (words.empty() || words.back() != w) words.push_back(w);
    }
    // The merged pair is gone from every word; drop its (now empty) entry.
    if (const auto found = pairs_.find(pair); found != pairs_.end() && found->second.count == 0) {
      pairs_.erase(found);
    }
  }

  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> frequencies_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::vector<tokenizer_detail::Merge> merges_;
  std::unordered_map<uint64_t, PairStats> pairs_;
  std::vector<Entry> heap_;
  std::vector<std::pair<uint64_t, int64_t>> deltas_;
  std::vector<std::pair<uint64_t, int32_t>> new_pairs_;
};

// A vocabulary token as tokenizer.json spells it: the byte-level alphabet, or the text itself for tokens
// that were read verbatim.
std::string token_string(const BpeModel& model, int32_t id) {
  return model.token_verbatim[id] ? model.token_bytes[id]
                                  : tokenizer_detail::bytes_to_unicode(model.token_bytes[id]);
}

nlohmann::ordered_json byte_level(bool add_prefix_space, bool use_regex) {
  nlohmann::ordered_json node;
  node["type"] = "ByteLevel";
  node["add_prefix_space"] = add_prefix_space;
  node["trim_offsets"] = true;
  node["use_regex"] = use_regex;
  return node;
}

}  // namespace

Tokenizer train_bpe_tokenizer(const std::vector<std::string_view>& texts, int64_t vocab_size,
                              const std::vector<std::string>& special_tokens) {
  check_special_tokens(special_tokens);
  const int64_t minimum = 256 + static_cast<int64_t>(special_tokens.size());
  if (vocab_size < minimum || vocab_size > kMaxTrainedVocab) {
    fail("vocab_size",
         "from " + to_text(minimum) + " (256 byte tokens + " + to_text(special_tokens.size()) +
             " special tokens) to " + to_text(kMaxTrainedVocab),
         to_text(vocab_size));
  }
  const auto target = static_cast<size_t>(vocab_size - static_cast<int64_t>(special_tokens.size()));
  BpeTrainer trainer(count_pre_tokens(texts, special_tokens));
  trainer.run(target);
  if (trainer.tokens().size() < target) {
    fail("vocab_size",
         "a size the training text can fill (at most " +
             to_text(trainer.tokens().size() + special_tokens.size()) + " for this text)",
         to_text(vocab_size), "use a smaller vocab_size or more training text");
  }
  for (const std::string& special : special_tokens) {
    if (trainer.has_token(special)) {
      fail("special_tokens", "special tokens that differ from every learned token",
           "'" + special + "', which the text's merges also produce", "use a marker such as <|name|>");
    }
  }

  auto impl = std::make_unique<Tokenizer::Impl>();
  BpeModel& model = impl->model;
  model.token_bytes = std::move(trainer.tokens());
  model.token_present.assign(model.token_bytes.size(), 1);
  model.token_verbatim.assign(model.token_bytes.size(), 0);
  model.merges = std::move(trainer.merges());
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    tokenizer_detail::AddedToken token;
    token.id = static_cast<int32_t>(target + i);
    token.content = special_tokens[i];
    model.added_tokens.push_back(std::move(token));
  }
  model.regexes.emplace_back(tokenizer_detail::kGpt2Pattern, false, "trained tokenizer");
  model.finalize();
  return Tokenizer(std::move(impl));
}

void save_trained_tokenizer(const Tokenizer& tokenizer, const std::string& path) {
  const BpeModel& model = tokenizer.impl_->model;
  using ordered_json = nlohmann::ordered_json;
  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  ordered_json added = ordered_json::array();
  for (const auto& token : model.added_tokens) {
    ordered_json entry;
    entry["id"] = token.id;
    entry["content"] = token.content;
    entry["single_word"] = token.single_word;
    entry["lstrip"] = token.lstrip;
    entry["rstrip"] = token.rstrip;
    entry["normalized"] = token.normalized;
    entry["special"] = token.special;
    added.push_back(std::move(entry));
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = model.nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr);

  const bool gpt2_only = model.regexes.size() == 1 && !model.regexes[0].literal() &&
                         model.regexes[0].pattern() == tokenizer_detail::kGpt2Pattern;
  if (model.regexes.empty() || gpt2_only) {
    root["pre_tokenizer"] = byte_level(model.add_prefix_space, gpt2_only);
  } else {
    // The loader only accepts add_prefix_space on a lone ByteLevel, so here it is false.
    ordered_json steps = ordered_json::array();
    for (const auto& regex : model.regexes) {
      ordered_json split;
      split["type"] = "Split";
      split["pattern"] = ordered_json{{regex.literal() ? "String" : "Regex", regex.pattern()}};
      split["behavior"] = "Isolated";
      split["invert"] = false;
      steps.push_back(std::move(split));
    }
    steps.push_back(byte_level(false, false));
    root["pre_tokenizer"] = ordered_json{{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
  }
  root["post_processor"] = nullptr;
  root["decoder"] = byte_level(true, true);

  ordered_json bpe;
  bpe["type"] = "BPE";
  bpe["dropout"] = nullptr;
  bpe["unk_token"] = nullptr;
  bpe["continuing_subword_prefix"] = nullptr;
  bpe["end_of_word_suffix"] = nullptr;
  bpe["fuse_unk"] = false;
  bpe["byte_fallback"] = false;
  bpe["ignore_merges"] = model.ignore_merges;
  ordered_json vocab = ordered_json::object();
  // ordered_json's operator[] searches its entries linearly, quadratic for a 150k vocabulary; the keys are
  // distinct, so append to the underlying vector directly.
  auto& entries = static_cast<std::vector<std::pair<const std::string, ordered_json>>&>(
      vocab.get_ref<ordered_json::object_t&>());
  entries.reserve(model.token_bytes.size());
  for (size_t id = 0; id < model.token_bytes.size(); ++id) {
    if (model.token_present[id]) entries.emplace_back(token_string(model, static_cast<int32_t>(id)), id);
  }
  bpe["vocab"] = std::move(vocab);
  ordered_json merges = ordered_json::array();
  for (const auto& merge : model.merges) {
    merges.push_back(
        ordered_json::array({token_string(model, merge.left), token_string(model, merge.right)}));
  }
  bpe["merges"] = std::move(merges);
  root["model"] = std::move(bpe);
  write_file_atomically(path, root.dump(2) + "\n");
}

}  // namespace meshtrain
