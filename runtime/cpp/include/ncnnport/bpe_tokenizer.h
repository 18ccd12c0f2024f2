// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json.
//
// Why in C++: the standalone runtime must turn a prompt into the ids the Python loop feeds the
// embedding graph and turn generated ids back into text, without Python. The target is the
// `tokenizers` library's behaviour, id for id, for the configurations our models ship:
//   added tokens (matched whole, leftmost-longest, before anything else)
//   normalizer: none or NFC (ICU)
//   pre_tokenizer: ByteLevel (GPT-2 regex optional, add_prefix_space), Split (regex or string,
//                  Isolated or Removed), or a Sequence of them; regexes run in PCRE2 (UTF + UCP)
//   model: BPE (merges as "a b" strings or [a, b] pairs, ignore_merges)
//   post_processor: none, ByteLevel, TemplateProcessing (single) or a Sequence of them
//   decoder: ByteLevel or none (tokens joined by spaces, as there).
// Anything else is refused at load time with an error naming the tokenizer.json field, so a
// tokenizer this class does not reproduce can never tokenize silently differently.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

// Unreadable file, bad JSON, wrong field type or unsupported component; one line naming it.
class TokenizerError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class BpeTokenizer {
public:
    // Throws TokenizerError naming the file and field on anything it cannot honour exactly.
    static BpeTokenizer from_file(const std::string& path);
    static BpeTokenizer from_json_text(const std::string& text, const std::string& origin);

    BpeTokenizer(BpeTokenizer&&) noexcept;
    BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
    ~BpeTokenizer();

    // Ids of `text` (valid UTF-8), as tokenizers' Tokenizer.encode(text).ids.
    std::vector<int> encode(const std::string& text) const;
    // Text of `ids`, as Tokenizer.decode(ids, skip_special_tokens=skip_special); unknown ids
    // are skipped and invalid UTF-8 becomes U+FFFD, as there.
    std::string decode(const std::vector<int>& ids, bool skip_special = true) const;
    // Size of the id space (largest id + 1).
    size_t vocab_size() const;

private:
    struct Impl;
    explicit BpeTokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace ncnnport
