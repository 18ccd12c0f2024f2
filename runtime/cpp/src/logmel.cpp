#include "ncnnport/logmel.h"

#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

namespace ncnnport {

namespace {

const double kLogStep = std::log(6.4) / 27.0;

double hz_to_mel(double hz) { return hz >= 1000.0 ? 15.0 + std::log(std::max(hz, 1e-12) / 1000.0) / kLogStep : hz / (200.0 / 3.0); }
double mel_to_hz(double mel) { return mel >= 15.0 ? 1000.0 * std::exp(kLogStep * (mel - 15.0)) : mel * (200.0 / 3.0); }

// numpy.linspace(start, stop, num): start + i * step, the last point exactly stop.
std::vector<double> linspace(double start, double stop, int num) {
    std::vector<double> out(num);
    const double step = (stop - start) / (num - 1);
    for (int i = 0; i < num; ++i) out[i] = i * step + start;
    out[num - 1] = stop;
    return out;
}

}  // namespace

int LogMel::valid() const {
    int n = 0;
    for (int32_t m : mask) n += m;
    return n;
}

std::vector<double> mel_filters(const LogMelConfig& cfg) {
    const int bins = cfg.n_fft / 2 + 1;
    const auto fft_hz = linspace(0.0, cfg.sample_rate / 2.0, bins);
    const auto mels = linspace(hz_to_mel(0.0), hz_to_mel(cfg.sample_rate / 2.0), cfg.n_mels + 2);
    std::vector<double> edges(mels.size());
    for (size_t i = 0; i < mels.size(); ++i) edges[i] = mel_to_hz(mels[i]);
    std::vector<double> out(static_cast<size_t>(bins) * cfg.n_mels);
    for (int b = 0; b < bins; ++b)
        for (int m = 0; m < cfg.n_mels; ++m) {
            const double lower = edges[m], centre = edges[m + 1], upper = edges[m + 2];
            const double rising = (fft_hz[b] - lower) / (centre - lower);
            const double falling = (upper - fft_hz[b]) / (upper - centre);
            out[static_cast<size_t>(b) * cfg.n_mels + m] =
                std::max(0.0, std::min(rising, falling)) * (2.0 / (upper - lower));
        }
    return out;
}

std::vector<float> hann_periodic(int n) {
    std::vector<float> w(n);
    const float step = static_cast<float>(2.0 * M_PI / n);
    for (int k = 0; k < n; ++k) {
        const float angle = static_cast<float>(k) * step;  // float32 product, as torch
        const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
        const float scaled = c * -0.5f;  // exact: a power-of-two scale
        w[k] = scaled + 0.5f;
    }
    return w;
}

LogMel log_mel(const std::vector<float>& wave, const LogMelConfig& cfg) {
    const int n = static_cast<int>(wave.size());
    const int half = cfg.n_fft / 2;
    if (n <= half)
        throw std::invalid_argument("waveform of " + std::to_string(n) + " samples is too short to reflect-pad by "
                                    + std::to_string(half));
    // reflect padding (numpy mode="reflect": the edge sample is not repeated)
    std::vector<float> padded(static_cast<size_t>(n) + 2 * half);
    for (int i = 0; i < half; ++i) padded[i] = wave[half - i];
    std::copy(wave.begin(), wave.end(), padded.begin() + half);
    for (int i = 0; i < half; ++i) padded[half + n + i] = wave[n - 2 - i];

    const int n_frames = n / cfg.hop;  // the last of the 1 + n // hop centred frames is dropped
    const int bins = cfg.n_fft / 2 + 1;
    const auto window = hann_periodic(cfg.n_fft);
    auto filters = mel_filters(cfg);
    for (double& f : filters) f = static_cast<double>(static_cast<float>(f));  // float32 filters, as HF

    std::unique_ptr<double, void (*)(void*)> in(fftw_alloc_real(cfg.n_fft), fftw_free);
    std::unique_ptr<fftw_complex, void (*)(void*)> spec(fftw_alloc_complex(bins), fftw_free);
    fftw_plan plan = fftw_plan_dft_r2c_1d(cfg.n_fft, in.get(), spec.get(), FFTW_ESTIMATE);
    if (plan == nullptr) throw std::runtime_error("fftw: no plan for a " + std::to_string(cfg.n_fft) + "-point FFT");
    std::vector<double> mel(static_cast<size_t>(cfg.n_mels) * n_frames);
    std::vector<double> power(bins);
    for (int f = 0; f < n_frames; ++f) {
        const float* frame = padded.data() + static_cast<size_t>(f) * cfg.hop;
        for (int k = 0; k < cfg.n_fft; ++k) in.get()[k] = static_cast<double>(frame[k] * window[k]);
        fftw_execute(plan);
        for (int b = 0; b < bins; ++b) power[b] = spec.get()[b][0] * spec.get()[b][0] + spec.get()[b][1] * spec.get()[b][1];
        for (int m = 0; m < cfg.n_mels; ++m) {
            double sum = 0.0;
            for (int b = 0; b < bins; ++b) sum += power[b] * filters[static_cast<size_t>(b) * cfg.n_mels + m];
            mel[static_cast<size_t>(m) * n_frames + f] = sum;
        }
    }
    fftw_destroy_plan(plan);

    double top = -INFINITY;
    for (double& v : mel) {
        v = std::log10(std::max(v, 1e-10));
        top = std::max(top, v);
    }
    LogMel out;
    out.n_mels = cfg.n_mels;
    const int multiple = 2 * cfg.n_window;
    out.frames = multiple > 1 ? n_frames + ((multiple - n_frames % multiple) % multiple) : n_frames;
    out.features.assign(static_cast<size_t>(cfg.n_mels) * out.frames, 0.0f);
    out.mask.assign(out.frames, 0);
    for (int f = 0; f < n_frames; ++f) out.mask[f] = 1;
    for (int m = 0; m < cfg.n_mels; ++m)
        for (int f = 0; f < n_frames; ++f) {
            const double v = std::max(mel[static_cast<size_t>(m) * n_frames + f], top - cfg.log_floor);
            out.features[static_cast<size_t>(m) * out.frames + f] = static_cast<float>((v + 4.0) / 4.0);
        }
    return out;
}

}  // namespace ncnnport
