#include "ncnnport/audio.h"

#include <sndfile.h>
#include <soxr.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace ncnnport {

Audio read_audio_file(const std::filesystem::path& path) {
    const std::string p = path.string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw AudioError("audio file not found: " + p);
    if (std::filesystem::is_directory(path, ec)) throw AudioError(p + " is a directory, not an audio file");
    SF_INFO info{};
    SNDFILE* raw = sf_open(p.c_str(), SFM_READ, &info);
    if (raw == nullptr) throw AudioError(p + ": not a readable audio file (" + sf_strerror(nullptr) + ")");
    std::unique_ptr<SNDFILE, int (*)(SNDFILE*)> file(raw, sf_close);
    if (info.channels <= 0 || info.samplerate <= 0)
        throw AudioError(p + ": " + std::to_string(info.channels) + " channels at " + std::to_string(info.samplerate) + " Hz");
    if (info.frames <= 0) throw AudioError(p + ": audio is empty (0 samples)");
    Audio audio;
    audio.rate = info.samplerate;
    audio.channels = info.channels;
    audio.samples.resize(static_cast<size_t>(info.frames) * info.channels);
    const sf_count_t got = sf_readf_float(file.get(), audio.samples.data(), info.frames);
    if (got <= 0) throw AudioError(p + ": not a readable audio file (no frames decoded)");
    audio.samples.resize(static_cast<size_t>(got) * info.channels);
    return audio;
}

std::vector<float> to_mono(const Audio& audio) {
    const size_t n = audio.samples.size() / audio.channels;
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
        double sum = 0.0;
        for (int c = 0; c < audio.channels; ++c) sum += audio.samples[i * audio.channels + c];
        out[i] = static_cast<float>(sum / audio.channels);
    }
    return out;
}

std::vector<float> resample(const std::vector<float>& x, double in_rate, double out_rate) {
    if (in_rate == out_rate) return x;
    soxr_error_t err = nullptr;
    const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
    std::unique_ptr<soxr, void (*)(soxr_t)> s(soxr_create(in_rate, out_rate, 1, &err, &io, &quality, nullptr),
                                              soxr_delete);
    if (err != nullptr || !s) throw AudioError(std::string("soxr: ") + (err ? err : "create failed"));
    const size_t ilen = x.size();
    const size_t olen = static_cast<size_t>(ilen * out_rate / in_rate + 1);
    const size_t block = static_cast<size_t>(std::max(1000., 48000 * in_rate / out_rate));
    std::vector<float> y(olen, 0.0f);
    size_t pos = 0, done = 0;
    for (size_t i = 0; i < ilen; i += block) {
        err = soxr_process(s.get(), x.data() + i, std::min(block, ilen - i), nullptr, y.data() + pos, olen - pos, &done);
        if (err != nullptr) throw AudioError(std::string("soxr: ") + err);
        pos += done;
    }
    err = soxr_process(s.get(), nullptr, 0, nullptr, y.data() + pos, olen - pos, &done);
    if (err != nullptr) throw AudioError(std::string("soxr: ") + err);
    y.resize(pos + done);
    return y;
}

void float_range_normalize(std::vector<float>& x) {
    float peak = 0.0f;
    for (float v : x) peak = std::max(peak, std::fabs(v));
    if (peak > 1.0f)
        for (float& v : x) v = v / peak;
    for (float& v : x) v = std::min(1.0f, std::max(-1.0f, v));
}

std::vector<float> read_audio_16k(const std::filesystem::path& path, int target_rate) {
    const Audio audio = read_audio_file(path);
    std::vector<float> mono = to_mono(audio);
    for (float v : mono)
        if (!std::isfinite(v)) throw AudioError(path.string() + ": audio contains NaN or Inf samples");
    std::vector<float> out = resample(mono, audio.rate, target_rate);
    if (out.empty())
        throw AudioError(path.string() + ": audio of " + std::to_string(mono.size()) + " sample(s) at "
                         + std::to_string(audio.rate) + " Hz resamples to 0 samples");
    float_range_normalize(out);
    return out;
}

}  // namespace ncnnport
