// UTF-8 helpers shared by the tokenizer: code point iteration, encoding, and the lossy
// decoding rule Rust's String::from_utf8_lossy applies (one U+FFFD per maximal invalid
// subpart), which `tokenizers` uses to turn decoded bytes into text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ncnnport::utf8 {

// Appends the UTF-8 encoding of code point `cp` to `out`.
void append(std::string& out, char32_t cp);

// Length in bytes of the well-formed sequence starting at s[i], or 0 when it is ill-formed;
// `consumed` receives the maximal subpart length (>= 1) to skip in that case.
size_t valid_sequence(const std::string& s, size_t i, size_t& consumed);

// Splits valid UTF-8 into its characters, each as its own byte string.
std::vector<std::string> chars(const std::string& s);

// Decodes one well-formed character at s[i] (as checked by valid_sequence).
char32_t decode_at(const std::string& s, size_t i, size_t len);

// Bytes to text, each maximal ill-formed subpart replaced by U+FFFD.
std::string lossy(const std::string& bytes);

}  // namespace ncnnport::utf8
