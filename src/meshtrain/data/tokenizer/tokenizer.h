// Byte-level BPE tokenizers: Hugging Face tokenizer.json (Qwen2/3, GPT-2 and the ones `meshtrain prepare`
// trains) and GPT-2's original encoder.json + vocab.bpe. Encoding never prepends or appends anything.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding tokenizer.json or encoder.json + vocab.bpe.
  // Unsupported model types, malformed files and missing pieces are MeshErrors naming the file.
  static Tokenizer load(const std::string& path);

  // Added tokens (tokenizer.json) in the text are recognised as single ids; the rest is normalised (NFC
  // where the file says so), pre-tokenised by the file's regex and BPE-merged.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same ids appended to `out`: no vector per call, for a caller that gathers many documents' ids.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // Exactly the bytes the ids stand for (added tokens as their text). Unknown ids are a MeshError.
  std::string decode(const std::vector<int32_t>& ids) const;

  // The token as the vocabulary file writes it: byte-level tokens in GPT-2's printable alphabet ("Ġthe"),
  // added tokens as their content. Fails (naming the file) for an id the tokenizer does not define.
  std::string token_string(int32_t id) const;
  int64_t vocab_size() const;              // largest id + 1, added tokens included
  std::optional<int32_t> eos_id() const;   // "<|endoftext|>" when present
  const std::string& source_path() const;  // the file actually read (tokenizer.json or encoder.json)
  std::string identity() const;            // stable hash of the vocabulary and merges, for checkpoints

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend void save_trained_tokenizer(const Tokenizer&, const std::string&);
  friend Tokenizer train_bpe_tokenizer(const std::vector<std::string_view>&, int64_t,
                                       const std::vector<std::string>&);
};

// Trains a byte-level BPE tokenizer (GPT-2 pre-tokenizer regex, 256 byte tokens, then merges) on `texts`
// until `vocab_size` ids exist, `special_tokens` (e.g. "<|endoftext|>") included as added tokens at the end.
Tokenizer train_bpe_tokenizer(const std::vector<std::string_view>& texts, int64_t vocab_size,
                              const std::vector<std::string>& special_tokens);
// Writes a Hugging Face tokenizer.json that Tokenizer::load (and Hugging Face `tokenizers`) reads back.
void save_trained_tokenizer(const Tokenizer& tokenizer, const std::string& path);

}  // namespace meshtrain
