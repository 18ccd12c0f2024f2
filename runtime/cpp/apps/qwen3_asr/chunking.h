// The official long-audio cut rule and output parsing of Qwen3-ASR (models/qwen3_asr/chunking.py).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace qwen3_asr {

struct Chunk {
    size_t start = 0, end = 0;   // input range [start, end)
    std::vector<float> samples;  // zero-padded to the minimum when the input was cut
};

// One pass up to max_seconds; longer input is cut near every max_seconds at the quietest
// 100 ms window within +-5 s (lowest sum of |x|, then its lowest-|x| sample; first on ties).
std::vector<Chunk> split_audio(const std::vector<float>& wave, int sr, double max_seconds);

struct Parsed {
    std::optional<std::string> language;
    std::string text;
};

// A forced language as the official transcribe() takes it: empty -> none; otherwise the
// canonical name ("english" -> "English"), which must be a supported language
// (std::invalid_argument otherwise, naming the supported names).
std::optional<std::string> normalize_forced_language(const std::string& language);
// The official parse of one chunk's decoded text (runaway repeats cleaned first).
Parsed parse_asr_output(const std::string& raw, const std::optional<std::string>& forced);
// Texts joined with nothing between; languages comma-joined without consecutive duplicates.
Parsed join_results(const std::vector<Parsed>& parsed);

}  // namespace qwen3_asr
