// Whisper-style log-mel features, numerically as models/qwen3_asr/features.py computes them.
//
// Why: the encoder's input must be the one the Python loop (and transformers' extractor) builds:
// centred STFT with reflect padding, periodic Hann built in float32 as torch builds it, the
// frame x window product in float32, a float64 FFT (FFTW), float32-rounded Slaney mel filters
// applied in float64, log10 with the (max - floor) clamp, (x + 4) / 4, the last STFT frame
// dropped, and the frame axis zero-padded to a multiple of 2 * n_window with a validity mask.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace ncnnport {

struct LogMelConfig {
    int sample_rate = 16000;
    int n_fft = 400;
    int hop = 160;
    int n_mels = 128;
    int n_window = 50;         // frames padded to a multiple of 2 * n_window
    double log_floor = 8.0;    // dynamic range kept below the maximum, log10 units
};

struct LogMel {
    std::vector<float> features;  // [n_mels, frames] row-major, frames = padded frame count
    std::vector<int32_t> mask;    // [frames], 1 for a real frame
    int n_mels = 0;
    int frames = 0;
    int valid() const;
};

// Slaney mel filters [n_fft/2 + 1, n_mels] in float64, area-normalised (features.mel_filters).
std::vector<double> mel_filters(const LogMelConfig& cfg);
// Periodic Hann of n_fft as float32 (features.hann_periodic).
std::vector<float> hann_periodic(int n);
// Features of a 16 kHz mono waveform; std::invalid_argument when it has <= n_fft / 2 samples.
LogMel log_mel(const std::vector<float>& wave, const LogMelConfig& cfg);

}  // namespace ncnnport
