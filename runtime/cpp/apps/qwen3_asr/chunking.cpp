#include "chunking.h"

#include <unicode/unistr.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ncnnport/utf8.h"

namespace qwen3_asr {

namespace {

constexpr double kMinSeconds = 0.5;
constexpr double kSearchSeconds = 5.0;
constexpr double kQuietWindowSeconds = 0.1;
constexpr int kRepetitionThreshold = 20;
const char* const kAsrTextMarker = "<asr_text>";
const char* const kLanguagePrefix = "language ";
const char* const kSupported[] = {
    "Chinese", "English", "Cantonese", "Arabic", "German", "French", "Spanish", "Portuguese",
    "Indonesian", "Italian", "Korean", "Russian", "Thai", "Vietnamese", "Japanese", "Turkish",
    "Hindi", "Malay", "Dutch", "Swedish", "Danish", "Finnish", "Polish", "Czech", "Filipino",
    "Persian", "Greek", "Romanian", "Hungarian", "Macedonian"};

// chunking.find_quiet_cut. The window sums are exact sums rounded to float32 (the official
// float32 np.convolve rounds in BLAS order, so an exact near-tie could resolve differently).
size_t find_quiet_cut(const std::vector<float>& wave, size_t start, size_t cut, size_t expand, size_t window) {
    const size_t n = wave.size();
    const size_t left = std::max(start, cut > expand ? cut - expand : 0);
    const size_t right = std::min(n, cut + expand);
    size_t boundary = cut;
    if (right > left && right - left > window) {
        std::vector<double> prefix(right - left + 1, 0.0);
        for (size_t i = left; i < right; ++i) prefix[i - left + 1] = prefix[i - left] + std::fabs(wave[i]);
        size_t first = 0;
        float best = INFINITY;
        for (size_t i = 0; i + window <= right - left; ++i) {
            const float s = static_cast<float>(prefix[i + window] - prefix[i]);
            if (s < best) best = s, first = i;
        }
        size_t quiet = 0;
        for (size_t i = 1; i < window; ++i)
            if (std::fabs(wave[left + first + i]) < std::fabs(wave[left + first + quiet])) quiet = i;
        boundary = left + first + quiet;
    }
    return std::min(std::max(boundary, start + 1), n);
}

std::u32string to_u32(const std::string& s) {
    std::u32string out;
    for (size_t i = 0; i < s.size();) {
        size_t skip = 1;
        const size_t len = ncnnport::utf8::valid_sequence(s, i, skip);
        if (len == 0) { out.push_back(0xFFFD); i += skip; continue; }
        out.push_back(ncnnport::utf8::decode_at(s, i, len));
        i += len;
    }
    return out;
}

std::string to_utf8(const std::u32string& s) {
    std::string out;
    for (char32_t c : s) ncnnport::utf8::append(out, c);
    return out;
}

// Python's str.isspace for the characters it is true of.
bool is_space(char32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680
           || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::u32string strip(const std::u32string& s) {
    size_t a = 0, b = s.size();
    while (a < b && is_space(s[a])) ++a;
    while (b > a && is_space(s[b - 1])) --b;
    return s.substr(a, b - a);
}

std::string lower_ascii(std::string s) {
    for (char& c : s) if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
}

// re.sub(r"(.)\1{threshold,}", r"\1", DOTALL): a run longer than threshold kept once.
std::u32string collapse_char_runs(const std::u32string& s, int threshold) {
    std::u32string out;
    for (size_t i = 0; i < s.size();) {
        size_t j = i;
        while (j < s.size() && s[j] == s[i]) ++j;
        if (j - i > static_cast<size_t>(threshold)) out.push_back(s[i]);
        else out.append(s, i, j - i);
        i = j;
    }
    return out;
}

// chunking._collapse_pattern_repeat, iterative over the remaining text.
std::u32string collapse_pattern_repeat(std::u32string text, int threshold, int max_len = 20) {
    std::u32string out;
    const size_t t = static_cast<size_t>(threshold);
    while (true) {
        const size_t n = text.size();
        if (n < 2 * t) return out + text;
        bool found = false;
        for (size_t i = 0; i + 2 * t <= n && !found; ++i) {
            for (size_t k = 1; k <= static_cast<size_t>(max_len); ++k) {
                if (i + k * t > n) break;
                bool repeats = true;
                for (size_t r = 1; r < t && repeats; ++r) repeats = text.compare(i + r * k, k, text, i, k) == 0;
                if (!repeats) continue;
                size_t end = i + t * k;
                while (end + k <= n && text.compare(end, k, text, i, k) == 0) end += k;
                out += text.substr(0, i) + text.substr(i, k);
                text = text.substr(end);
                found = true;
                break;
            }
        }
        if (!found) return out + text;
    }
}

std::string canonical_language_name(const std::string& name) {
    std::u32string text = strip(to_u32(name));
    if (text.empty()) return "";
    icu::UnicodeString head = icu::UnicodeString(static_cast<UChar32>(text[0]));
    icu::UnicodeString rest = icu::UnicodeString::fromUTF8(to_utf8(text.substr(1)));
    std::string out;
    head.toUpper().toUTF8String(out);
    rest.toLower().toUTF8String(out);
    return out;
}

std::optional<std::string> language_from_head(const std::u32string& head) {
    size_t i = 0;
    while (i < head.size()) {
        size_t j = i;
        while (j < head.size() && head[j] != '\n' && head[j] != '\r' && head[j] != 0x0b && head[j] != 0x0c
               && !(head[j] >= 0x1c && head[j] <= 0x1e) && head[j] != 0x85 && head[j] != 0x2028 && head[j] != 0x2029)
            ++j;
        const std::u32string line = strip(head.substr(i, j - i));
        i = j + 1;
        if (line.empty()) continue;
        const std::string text = to_utf8(line);
        if (lower_ascii(text.substr(0, 9)) == kLanguagePrefix) {
            const std::string value = to_utf8(strip(line.substr(9)));
            if (value.empty()) return std::nullopt;
            return canonical_language_name(value);
        }
        return std::nullopt;
    }
    return std::nullopt;
}

}  // namespace

std::vector<Chunk> split_audio(const std::vector<float>& wave, int sr, double max_seconds) {
    if (max_seconds <= 0) throw std::invalid_argument("max_seconds must be positive");
    if (wave.empty()) throw std::invalid_argument("audio is empty");
    const size_t n = wave.size();
    std::vector<size_t> bounds{0};
    if (static_cast<double>(n) / sr > max_seconds) {
        const size_t max_len = std::max<size_t>(1, static_cast<size_t>(max_seconds * sr));
        const size_t expand = static_cast<size_t>(kSearchSeconds * sr);
        const size_t window = std::max<size_t>(4, static_cast<size_t>(kQuietWindowSeconds * sr));
        size_t start = 0;
        while (n - start > max_len) {
            start = find_quiet_cut(wave, start, start + max_len, expand, window);
            bounds.push_back(start);
        }
    }
    bounds.push_back(n);
    const bool was_cut = bounds.size() > 2;
    const size_t min_len = static_cast<size_t>(kMinSeconds * sr);
    std::vector<Chunk> chunks;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
        Chunk c;
        c.start = bounds[i];
        c.end = bounds[i + 1];
        c.samples.assign(wave.begin() + c.start, wave.begin() + c.end);
        if (was_cut && c.samples.size() < min_len) c.samples.resize(min_len, 0.0f);
        chunks.push_back(std::move(c));
    }
    return chunks;
}

std::optional<std::string> normalize_forced_language(const std::string& language) {
    if (strip(to_u32(language)).empty()) return std::nullopt;
    const std::string name = canonical_language_name(language);
    std::string all;
    for (const char* s : kSupported) {
        if (name == s) return name;
        all += (all.empty() ? "" : ", ") + std::string(s);
    }
    throw std::invalid_argument("--language '" + language + "': unsupported language '" + name
                                + "'; supported (names, not codes): " + all);
}

Parsed parse_asr_output(const std::string& raw, const std::optional<std::string>& forced) {
    const std::u32string stripped = strip(to_u32(raw));
    if (stripped.empty()) return {std::nullopt, ""};
    const std::u32string text =
        collapse_pattern_repeat(collapse_char_runs(stripped, kRepetitionThreshold), kRepetitionThreshold);
    if (forced) return {forced, to_utf8(text)};
    const std::u32string marker = to_u32(kAsrTextMarker);
    const size_t at = text.find(marker);
    if (at == std::u32string::npos) return {std::nullopt, to_utf8(strip(text))};
    const std::u32string head = text.substr(0, at), body = text.substr(at + marker.size());
    if (lower_ascii(to_utf8(head)).find("language none") != std::string::npos) return {std::nullopt, to_utf8(strip(body))};
    return {language_from_head(head), to_utf8(strip(body))};
}

Parsed join_results(const std::vector<Parsed>& parsed) {
    Parsed out;
    std::vector<std::string> langs;
    for (const auto& p : parsed) {
        out.text += p.text;
        const std::string lang = p.language ? to_utf8(strip(to_u32(*p.language))) : "";
        if (!lang.empty() && (langs.empty() || langs.back() != lang)) langs.push_back(lang);
    }
    if (!langs.empty()) {
        std::string joined;
        for (const auto& l : langs) joined += (joined.empty() ? "" : ",") + l;
        out.language = joined;
    }
    return out;
}

}  // namespace qwen3_asr
