// Any audio file -> mono float32 at 16 kHz, as models/qwen3_asr/audio.py reads it.
//
// Why: the official recipe (qwen-asr 0.0.6) averages channels, resamples with soxr "HQ" and
// divides a waveform whose peak exceeds 1 by that peak; the Python loop does the same with
// soundfile + python-soxr, so the C++ runtime reads through the same C libraries (libsndfile,
// libsoxr) with the same calls: float frames, channel mean in double, soxr HQ (no flags) fed in
// python-soxr's blocks of max(1000, 48000 * in / out) samples, then the range rule.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

// Missing, unreadable, empty or non-finite audio; one line naming the file.
class AudioError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct Audio {
    std::vector<float> samples;  // interleaved frames x channels
    int rate = 0;
    int channels = 0;
};

// Frames of `path` as float32 (libsndfile's normalised float read); AudioError naming the file.
Audio read_audio_file(const std::filesystem::path& path);
// Channel mean: float32 values summed in double, divided by the count, rounded to float32.
std::vector<float> to_mono(const Audio& audio);
// soxr HQ resampling of mono float32, as python-soxr's resample() drives libsoxr.
std::vector<float> resample(const std::vector<float>& x, double in_rate, double out_rate);
// A peak |x| above 1 divides by the peak (float32), then clip to [-1, 1]; otherwise unchanged.
void float_range_normalize(std::vector<float>& x);
// read -> mono -> 16 kHz -> range rule; AudioError naming the file for any bad input.
std::vector<float> read_audio_16k(const std::filesystem::path& path, int target_rate = 16000);

}  // namespace ncnnport
