#include "ncnnport/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "ncnnport/utf8.h"

using nlohmann::json;

namespace ncnnport {
namespace {

// The GPT-2 pre-tokenizer regex that ByteLevel(use_regex=true) applies.
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes keep their code
// point, the other 68 bytes take 256, 257, ... in byte order.
std::vector<char32_t> byte_to_char_table() {
    std::vector<char32_t> table(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        table[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return table;
}

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
    throw TokenizerError(origin + ": " + what);
}

const json& field(const json& obj, const char* key, const std::string& where, const std::string& origin) {
    if (!obj.is_object() || !obj.contains(key)) fail(origin, where + "." + key + " missing");
    return obj.at(key);
}

bool flag(const json& obj, const char* key, bool fallback, const std::string& where, const std::string& origin) {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_boolean()) fail(origin, where + "." + key + " is not a boolean");
    return obj.at(key).get<bool>();
}

std::string type_of(const json& obj, const std::string& where, const std::string& origin) {
    const json& t = field(obj, "type", where, origin);
    if (!t.is_string()) fail(origin, where + ".type is not a string");
    return t.get<std::string>();
}

// A compiled PCRE2 pattern (UTF + Unicode properties, as the Oniguruma regexes of tokenizers).
class Regex {
public:
    Regex(const std::string& pattern, bool literal, const std::string& where, const std::string& origin) {
        int err = 0;
        PCRE2_SIZE offset = 0;
        // PCRE2 refuses UCP together with LITERAL; a literal needs no character classes.
        const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &offset, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fail(origin, where + ": regex does not compile at offset " + std::to_string(offset) + ": " +
                             reinterpret_cast<const char*>(msg));
        }
        data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;
    ~Regex() {
        pcre2_match_data_free(data_);
        pcre2_code_free(code_);
    }

    // [start, end) byte ranges of every non-overlapping match, left to right.
    std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const {
        std::vector<std::pair<size_t, size_t>> out;
        size_t pos = 0;
        while (pos <= s.size()) {
            const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, 0, data_, nullptr);
            if (rc < 0) break;
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
            if (ov[1] == ov[0]) {  // empty match: step one character
                if (ov[0] >= s.size()) break;
                size_t consumed = 1;
                const size_t len = utf8::valid_sequence(s, ov[0], consumed);
                pos = ov[0] + (len ? len : consumed);
                continue;
            }
            out.emplace_back(ov[0], ov[1]);
            pos = ov[1];
        }
        return out;
    }

private:
    pcre2_code* code_ = nullptr;
    pcre2_match_data* data_ = nullptr;
};

// One pre-tokenizer step over the current pieces.
struct PreStep {
    enum Kind { kSplit, kByteLevel } kind = kSplit;
    std::shared_ptr<Regex> regex;  // Split pattern, or the GPT-2 regex (ByteLevel use_regex)
    bool keep_matches = true;      // Split: Isolated keeps matches, Removed drops them
    bool add_prefix_space = false;  // ByteLevel
};

struct AddedToken {
    int id;
    std::string content;
    bool special;
};

// Isolated split: the gaps and (when keep_matches) the matches, empty pieces dropped.
std::vector<std::string> split_pieces(const std::string& s, const Regex& re, bool keep_matches) {
    std::vector<std::string> out;
    size_t last = 0;
    for (const auto& [a, b] : re.find_all(s)) {
        if (a > last) out.push_back(s.substr(last, a - last));
        if (keep_matches) out.push_back(s.substr(a, b - a));
        last = b;
    }
    if (last < s.size()) out.push_back(s.substr(last));
    return out;
}

}  // namespace

struct BpeTokenizer::Impl {
    std::string origin;
    std::vector<AddedToken> added;
    bool nfc = false;
    std::vector<PreStep> steps;
    bool byte_level_decoder = false;
    std::unordered_map<std::string, int> vocab;
    std::vector<std::string> id_to_token;
    std::vector<char> id_is_special;
    std::unordered_map<std::string, std::pair<int, int>> merges;  // "a\0b" -> (rank, merged id)
    bool ignore_merges = false;
    int unk_id = -1;
    std::vector<char32_t> byte_to_char = byte_to_char_table();
    std::unordered_map<char32_t, unsigned char> char_to_byte;

    void load(const json& doc);
    void load_added(const json& list);
    void load_normalizer(const json& n, const std::string& where);
    void load_pre_tokenizer(const json& p, const std::string& where);
    void load_model(const json& m);
    void load_post_processor(const json& p, const std::string& where);
    void load_tail(const json& doc);

    struct TemplateItem {
        bool sequence;          // the encoded text goes here
        std::vector<int> ids;   // otherwise these special ids
    };
    std::vector<TemplateItem> template_items;  // empty: ids unchanged

    std::vector<std::pair<std::string, int>> split_added(const std::string& text) const;
    std::vector<std::string> pre_tokenize(std::string text) const;
    std::string byte_map(const std::string& piece) const;
    void bpe(const std::string& word, std::vector<int>& ids) const;
    std::string token_bytes(const std::string& token) const;
};

void BpeTokenizer::Impl::load(const json& doc) {
    if (!doc.is_object()) fail(origin, "top level is not a JSON object");
    for (int b = 0; b < 256; ++b) char_to_byte[byte_to_char[b]] = static_cast<unsigned char>(b);
    load_model(field(doc, "model", "tokenizer", origin));
    if (doc.contains("added_tokens") && !doc["added_tokens"].is_null()) load_added(doc["added_tokens"]);
    if (doc.contains("normalizer")) load_normalizer(doc["normalizer"], "normalizer");
    if (doc.contains("pre_tokenizer")) load_pre_tokenizer(doc["pre_tokenizer"], "pre_tokenizer");
    load_tail(doc);
}

void BpeTokenizer::Impl::load_added(const json& list) {
    if (!list.is_array()) fail(origin, "added_tokens is not an array");
    for (size_t i = 0; i < list.size(); ++i) {
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        const json& t = list[i];
        const json& id = field(t, "id", where, origin);
        const json& content = field(t, "content", where, origin);
        if (!id.is_number_integer() || id.get<long long>() < 0 || id.get<long long>() > INT_MAX)
            fail(origin, where + ".id is not a non-negative integer");
        if (!content.is_string() || content.get<std::string>().empty())
            fail(origin, where + ".content is not a non-empty string");
        for (const char* opt : {"single_word", "lstrip", "rstrip"}) {
            if (flag(t, opt, false, where, origin)) fail(origin, where + "." + opt + "=true is not supported");
        }
        const int tid = static_cast<int>(id.get<long long>());
        const bool special = flag(t, "special", false, where, origin);
        added.push_back({tid, content.get<std::string>(), special});
        if (static_cast<size_t>(tid) >= id_to_token.size()) {
            id_to_token.resize(tid + 1);
            id_is_special.resize(tid + 1, 0);
        }
        id_to_token[tid] = content.get<std::string>();
        id_is_special[tid] = special;
    }
}

void BpeTokenizer::Impl::load_normalizer(const json& n, const std::string& where) {
    if (n.is_null()) return;
    const std::string type = type_of(n, where, origin);
    if (type == "NFC") {
        nfc = true;
    } else if (type == "Sequence") {
        const json& items = field(n, "normalizers", where, origin);
        if (!items.is_array()) fail(origin, where + ".normalizers is not an array");
        for (size_t i = 0; i < items.size(); ++i)
            load_normalizer(items[i], where + ".normalizers[" + std::to_string(i) + "]");
    } else {
        fail(origin, where + ".type " + type + " is not supported (NFC or Sequence only)");
    }
}

void BpeTokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& where) {
    if (p.is_null()) return;
    const std::string type = type_of(p, where, origin);
    if (type == "Sequence") {
        const json& items = field(p, "pretokenizers", where, origin);
        if (!items.is_array()) fail(origin, where + ".pretokenizers is not an array");
        for (size_t i = 0; i < items.size(); ++i)
            load_pre_tokenizer(items[i], where + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "ByteLevel") {
        PreStep step;
        step.kind = PreStep::kByteLevel;
        step.add_prefix_space = flag(p, "add_prefix_space", true, where, origin);
        if (flag(p, "use_regex", true, where, origin))
            step.regex = std::make_shared<Regex>(kGpt2Pattern, false, where, origin);
        steps.push_back(step);
    } else if (type == "Split") {
        const json& pattern = field(p, "pattern", where, origin);
        const bool is_regex = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
        const bool is_string = pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
        if (!is_regex && !is_string) fail(origin, where + ".pattern needs a Regex or String string");
        const json& behavior = field(p, "behavior", where, origin);
        if (!behavior.is_string() || (behavior != "Isolated" && behavior != "Removed"))
            fail(origin, where + ".behavior " + behavior.dump() + " is not supported (Isolated or Removed)");
        if (flag(p, "invert", false, where, origin)) fail(origin, where + ".invert=true is not supported");
        PreStep step;
        step.regex = std::make_shared<Regex>(pattern[is_regex ? "Regex" : "String"].get<std::string>(), is_string,
                                             where + ".pattern", origin);
        step.keep_matches = behavior == "Isolated";
        steps.push_back(step);
    } else {
        fail(origin, where + ".type " + type + " is not supported (ByteLevel, Split or Sequence)");
    }
}

void BpeTokenizer::Impl::load_model(const json& m) {
    if (type_of(m, "model", origin) != "BPE") fail(origin, "model.type is not BPE");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
        if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
            fail(origin, std::string("model.") + key + " is not supported");
    }
    if (flag(m, "byte_fallback", false, "model", origin)) fail(origin, "model.byte_fallback=true is not supported");
    ignore_merges = flag(m, "ignore_merges", false, "model", origin);
    const json& v = field(m, "vocab", "model", origin);
    if (!v.is_object()) fail(origin, "model.vocab is not an object");
    for (const auto& [token, id] : v.items()) {
        if (!id.is_number_integer() || id.get<long long>() < 0 || id.get<long long>() > INT_MAX)
            fail(origin, "model.vocab[\"" + token + "\"] is not a non-negative integer");
        const int tid = static_cast<int>(id.get<long long>());
        vocab[token] = tid;
        if (static_cast<size_t>(tid) >= id_to_token.size()) {
            id_to_token.resize(tid + 1);
            id_is_special.resize(tid + 1, 0);
        }
        id_to_token[tid] = token;
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        const auto it = vocab.find(m["unk_token"].get<std::string>());
        if (it == vocab.end()) fail(origin, "model.unk_token is not in model.vocab");
        unk_id = it->second;
    }
    const json& list = field(m, "merges", "model", origin);
    if (!list.is_array()) fail(origin, "model.merges is not an array");
    for (size_t rank = 0; rank < list.size(); ++rank) {
        const json& e = list[rank];
        std::string a, b;
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                fail(origin, "model.merges[" + std::to_string(rank) + "] is not \"a b\"");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get<std::string>();
            b = e[1].get<std::string>();
        } else {
            fail(origin, "model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [a, b]");
        }
        const auto merged = vocab.find(a + b);
        if (!vocab.count(a) || !vocab.count(b) || merged == vocab.end())
            fail(origin, "model.merges[" + std::to_string(rank) + "] uses a token not in model.vocab");
        merges[a + '\0' + b] = {static_cast<int>(rank), merged->second};  // a later duplicate wins
    }
}

// ByteLevel (offsets only), TemplateProcessing ("single" template: special ids around the
// sequence, what encode(text, add_special_tokens=True) applies) or a Sequence of them.
void BpeTokenizer::Impl::load_post_processor(const json& p, const std::string& where) {
    if (p.is_null()) return;
    const std::string type = type_of(p, where, origin);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
        const json& items = field(p, "processors", where, origin);
        if (!items.is_array()) fail(origin, where + ".processors is not an array");
        for (size_t i = 0; i < items.size(); ++i)
            load_post_processor(items[i], where + ".processors[" + std::to_string(i) + "]");
        return;
    }
    if (type != "TemplateProcessing") fail(origin, where + ".type " + type + " is not supported");
    if (!template_items.empty()) fail(origin, where + ": more than one TemplateProcessing");
    const json& single = field(p, "single", where, origin);
    const json& specials = field(p, "special_tokens", where, origin);
    if (!single.is_array() || !specials.is_object()) fail(origin, where + ".single / .special_tokens have wrong types");
    bool has_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
        const std::string at = where + ".single[" + std::to_string(i) + "]";
        const json& item = single[i];
        if (item.is_object() && item.contains("Sequence")) {
            if (has_sequence) fail(origin, at + ": the single template holds the sequence twice");
            has_sequence = true;
            template_items.push_back({true, {}});
            continue;
        }
        if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
            !item["SpecialToken"]["id"].is_string())
            fail(origin, at + " is neither a Sequence nor a SpecialToken with a string id");
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
            fail(origin, where + ".special_tokens[\"" + name + "\"].ids missing");
        std::vector<int> ids;
        for (const json& id : specials[name]["ids"]) {
            if (!id.is_number_integer()) fail(origin, where + ".special_tokens[\"" + name + "\"].ids holds a non-integer");
            ids.push_back(id.get<int>());
        }
        template_items.push_back({false, ids});
    }
    if (!has_sequence) fail(origin, where + ".single has no Sequence");
}

void BpeTokenizer::Impl::load_tail(const json& doc) {
    if (doc.contains("post_processor")) load_post_processor(doc["post_processor"], "post_processor");
    if (doc.contains("decoder") && !doc["decoder"].is_null()) {
        const std::string type = type_of(doc["decoder"], "decoder", origin);
        if (type != "ByteLevel") fail(origin, "decoder.type " + type + " is not supported (ByteLevel only)");
        byte_level_decoder = true;
    }
    if (doc.contains("truncation") && !doc["truncation"].is_null()) fail(origin, "truncation is not supported");
    if (doc.contains("padding") && !doc["padding"].is_null()) fail(origin, "padding is not supported");
}

// Leftmost-longest match of the added tokens (as tokenizers' AddedVocabulary): text pieces
// get id -1, added tokens their id.
std::vector<std::pair<std::string, int>> BpeTokenizer::Impl::split_added(const std::string& text) const {
    std::vector<std::pair<std::string, int>> out;
    size_t start = 0, i = 0;
    while (i < text.size()) {
        const AddedToken* best = nullptr;
        for (const auto& t : added) {
            if (text.compare(i, t.content.size(), t.content) == 0 && (!best || t.content.size() > best->content.size()))
                best = &t;
        }
        if (!best) {
            ++i;
            continue;
        }
        if (i > start) out.emplace_back(text.substr(start, i - start), -1);
        out.emplace_back(best->content, best->id);
        i += best->content.size();
        start = i;
    }
    if (start < text.size()) out.emplace_back(text.substr(start), -1);
    return out;
}

std::string BpeTokenizer::Impl::byte_map(const std::string& piece) const {
    std::string out;
    for (unsigned char c : piece) utf8::append(out, byte_to_char[c]);
    return out;
}

// Normalizer, then every pre-tokenizer step in order over the current pieces.
std::vector<std::string> BpeTokenizer::Impl::pre_tokenize(std::string text) const {
    if (nfc) {
        UErrorCode status = U_ZERO_ERROR;
        const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(status);
        icu::UnicodeString u = norm->normalize(icu::UnicodeString::fromUTF8(text), status);
        if (U_FAILURE(status)) throw TokenizerError(origin + ": NFC normalisation failed");
        text.clear();
        u.toUTF8String(text);
    }
    std::vector<std::string> pieces{text};
    for (const auto& step : steps) {
        std::vector<std::string> next;
        for (auto& piece : pieces) {
            if (step.kind == PreStep::kByteLevel && step.add_prefix_space && piece.rfind(' ', 0) != 0)
                piece.insert(piece.begin(), ' ');
            std::vector<std::string> parts =
                step.regex ? split_pieces(piece, *step.regex, step.keep_matches) : std::vector<std::string>{piece};
            for (auto& part : parts) next.push_back(step.kind == PreStep::kByteLevel ? byte_map(part) : part);
        }
        pieces = std::move(next);
    }
    return pieces;
}

// Merges the lowest-ranked adjacent pair (leftmost on ties) until no pair has a rank.
void BpeTokenizer::Impl::bpe(const std::string& word, std::vector<int>& ids) const {
    if (ignore_merges) {
        const auto it = vocab.find(word);
        if (it != vocab.end()) {
            ids.push_back(it->second);
            return;
        }
    }
    std::vector<std::string> symbols;
    for (auto& ch : utf8::chars(word)) {
        if (vocab.count(ch)) symbols.push_back(std::move(ch));
        else if (unk_id >= 0) symbols.push_back(id_to_token[unk_id]);
        // tokenizers drops a character outside the vocabulary when there is no unk_token
    }
    while (symbols.size() > 1) {
        int best_rank = INT_MAX;
        size_t best = 0;
        for (size_t k = 0; k + 1 < symbols.size(); ++k) {
            const auto it = merges.find(symbols[k] + '\0' + symbols[k + 1]);
            if (it != merges.end() && it->second.first < best_rank) {
                best_rank = it->second.first;
                best = k;
            }
        }
        if (best_rank == INT_MAX) break;
        symbols[best] += symbols[best + 1];
        symbols.erase(symbols.begin() + static_cast<long>(best) + 1);
    }
    for (const auto& s : symbols) ids.push_back(vocab.at(s));
}

// ByteLevel decoder, token by token: all characters in the byte map -> those bytes, otherwise
// the token's own UTF-8 bytes (added tokens such as "<|im_end|>" pass through either way).
std::string BpeTokenizer::Impl::token_bytes(const std::string& token) const {
    if (!byte_level_decoder) return token;
    std::string out;
    for (size_t i = 0; i < token.size();) {
        size_t consumed = 1;
        const size_t len = utf8::valid_sequence(token, i, consumed);
        if (!len) return token;
        const auto it = char_to_byte.find(utf8::decode_at(token, i, len));
        if (it == char_to_byte.end()) return token;
        out.push_back(static_cast<char>(it->second));
        i += len;
    }
    return out;
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_json_text(const std::string& text, const std::string& origin) {
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) throw TokenizerError(origin + ": not valid JSON");
    auto impl = std::make_unique<Impl>();
    impl->origin = origin;
    try {
        impl->load(doc);
    } catch (const json::exception& e) {  // a type mismatch this loader did not pre-check
        throw TokenizerError(origin + ": unexpected field type (" + e.what() + ")");
    }
    return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw TokenizerError(path + ": cannot open");
    std::ostringstream buf;
    buf << in.rdbuf();
    return from_json_text(buf.str(), path);
}

std::vector<int> BpeTokenizer::encode(const std::string& text) const {
    std::vector<int> ids;
    for (const auto& [piece, id] : impl_->split_added(text)) {
        if (id >= 0) {
            ids.push_back(id);
            continue;
        }
        for (const auto& word : impl_->pre_tokenize(piece)) impl_->bpe(word, ids);
    }
    if (impl_->template_items.empty()) return ids;
    std::vector<int> out;
    for (const auto& item : impl_->template_items) {
        const std::vector<int>& part = item.sequence ? ids : item.ids;
        out.insert(out.end(), part.begin(), part.end());
    }
    return out;
}

std::string BpeTokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
    std::string out;
    bool first = true;
    for (int id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) continue;
        if (skip_special && impl_->id_is_special[id]) continue;
        const std::string& token = impl_->id_to_token[id];
        if (token.empty()) continue;  // an id no token owns
        if (!impl_->byte_level_decoder && !first) out += ' ';  // tokenizers joins with spaces without a decoder
        out += impl_->token_bytes(token);
        first = false;
    }
    return impl_->byte_level_decoder ? utf8::lossy(out) : out;
}

size_t BpeTokenizer::vocab_size() const { return impl_->id_to_token.size(); }

}  // namespace ncnnport
