#include "ncnnport/youtu_processor.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace ncnnport::youtu {

std::pair<int, int> target_size(int height, int width, int patch, int merge, int64_t max_patches, double step) {
    if (height < 1 || width < 1)
        throw ProcessorError("image size " + std::to_string(height) + "x" + std::to_string(width) + " is empty");
    const int unit = patch * merge;
    double scale = 1.0;
    while (true) {
        const int64_t h = std::max<int64_t>(unit, static_cast<int64_t>(std::ceil(height * scale / unit)) * unit);
        const int64_t w = std::max<int64_t>(unit, static_cast<int64_t>(std::ceil(width * scale / unit)) * unit);
        if ((h / patch) * (w / patch) <= max_patches) return {static_cast<int>(h), static_cast<int>(w)};
        scale -= step;  // in place, as the official loop: the accumulated binary error decides boundaries
        if (scale <= 0)
            throw ProcessorError("cannot fit a " + std::to_string(height) + "x" + std::to_string(width) + " image into "
                                 + std::to_string(max_patches) + " patches");
    }
}

namespace {

double triangle(double x) {
    x = std::fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

// _weights_precision: the largest shift keeping round(2 * wt_max * 2**p) below 2**15.
int weights_precision(double wt_max) {
    int precision = 0;
    while (precision < 22) {
        if (static_cast<int64_t>(0.5 + wt_max * static_cast<double>(int64_t{1} << (precision + 1))) >= (1 << 15)) break;
        ++precision;
    }
    return precision;
}

}  // namespace

AxisWeights axis_weights(int in_size, int out_size) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double support = scale >= 1.0 ? scale : 1.0;
    AxisWeights aw;
    aw.width = static_cast<int>(std::ceil(support)) * 2 + 1;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    std::vector<double> w(static_cast<size_t>(out_size) * aw.width, 0.0);
    aw.start.resize(out_size);
    double wt_max = 0.0;
    for (int i = 0; i < out_size; ++i) {
        const double center = scale * (i + 0.5);
        const int64_t start = std::max<int64_t>(static_cast<int64_t>(std::trunc(center - support + 0.5)), 0);
        const int64_t stop = std::min<int64_t>(static_cast<int64_t>(std::trunc(center + support + 0.5)), in_size);
        const int64_t size = std::clamp<int64_t>(stop - start, 0, aw.width);
        aw.start[i] = start;
        double* row = w.data() + static_cast<size_t>(i) * aw.width;
        double total = 0.0;  // summed tap by tap, as torch's _compute_index_ranges_weights
        for (int64_t k = 0; k < size; ++k) {
            row[k] = triangle((static_cast<double>(start + k) - center + 0.5) * invscale);
            total += row[k];
        }
        for (int k = 0; k < aw.width; ++k) {
            row[k] = total != 0.0 ? row[k] / total : 0.0;
            wt_max = std::max(wt_max, row[k]);
        }
    }
    aw.precision = weights_precision(wt_max);
    aw.taps.resize(w.size());
    const double one = static_cast<double>(int64_t{1} << aw.precision);
    for (size_t j = 0; j < w.size(); ++j) {
        const double v = w[j] * one;
        aw.taps[j] = static_cast<int64_t>(v < 0 ? std::trunc(v - 0.5) : std::trunc(v + 0.5));
    }
    return aw;
}

namespace {

// One separable pass over rows (axis 0) or columns (axis 1) of an HWC uint8 image.
RgbImage resample_axis(const RgbImage& src, int axis, int out_size) {
    const int in_size = axis == 0 ? src.height : src.width;
    if (in_size == out_size) return src;
    const AxisWeights aw = axis_weights(in_size, out_size);
    RgbImage dst;
    dst.height = axis == 0 ? out_size : src.height;
    dst.width = axis == 1 ? out_size : src.width;
    dst.rgb.resize(static_cast<size_t>(dst.height) * dst.width * 3);
    const int64_t bias = int64_t{1} << (aw.precision - 1);
    const int inner = axis == 0 ? src.width * 3 : 3;  // values per output index along the other axes
    const int outer = axis == 0 ? 1 : src.height;
    for (int o = 0; o < outer; ++o)
        for (int i = 0; i < out_size; ++i)
            for (int e = 0; e < inner; ++e) {
                int64_t acc = bias;
                for (int k = 0; k < aw.width; ++k) {
                    const int64_t idx = std::min<int64_t>(aw.start[i] + k, in_size - 1);
                    const size_t at = axis == 0 ? static_cast<size_t>(idx) * inner + e
                                                : (static_cast<size_t>(o) * src.width + idx) * 3 + e;
                    acc += static_cast<int64_t>(src.rgb[at]) * aw.taps[static_cast<size_t>(i) * aw.width + k];
                }
                const size_t out = axis == 0 ? static_cast<size_t>(i) * inner + e
                                             : (static_cast<size_t>(o) * dst.width + i) * 3 + e;
                dst.rgb[out] = static_cast<uint8_t>(std::clamp<int64_t>(acc >> aw.precision, 0, 255));
            }
    return dst;
}

}  // namespace

RgbImage resize_uint8(const RgbImage& image, int height, int width) {
    return resample_axis(resample_axis(image, 1, width), 0, height);
}

ProcessedImage process_image(const RgbImage& image, const ProcessorConfig& config) {
    ProcessedImage out;
    out.original_h = image.height;
    out.original_w = image.width;
    const auto [h, w] = target_size(image.height, image.width, config.patch, config.merge, config.max_patches,
                                    config.scale_step);
    out.resized_h = h;
    out.resized_w = w;
    const RgbImage resized = resize_uint8(image, h, w);
    // the fast processor's fused rescale + normalise, in float32: (x - 255*mean) / (255*std)
    std::array<float, 3> mean{}, std{};
    for (int c = 0; c < 3; ++c) {
        mean[c] = config.mean[c] * 255.0f;
        std[c] = config.std[c] * 255.0f;
    }
    const int p = config.patch, m = config.merge;
    out.grid_h = h / p;
    out.grid_w = w / p;
    out.merge_unit = m * m;
    out.patch_dim = p * p * 3;
    out.pixel_values.resize(static_cast<size_t>(out.num_patches()) * out.patch_dim);
    // rows (block_y, block_x, dy, dx); inside a row (py, px, c)
    size_t at = 0;
    for (int by = 0; by < out.grid_h / m; ++by)
        for (int bx = 0; bx < out.grid_w / m; ++bx)
            for (int dy = 0; dy < m; ++dy)
                for (int dx = 0; dx < m; ++dx)
                    for (int py = 0; py < p; ++py)
                        for (int px = 0; px < p; ++px) {
                            const int y = (by * m + dy) * p + py, x = (bx * m + dx) * p + px;
                            const uint8_t* pixel = resized.rgb.data() + (static_cast<size_t>(y) * w + x) * 3;
                            for (int c = 0; c < 3; ++c)
                                out.pixel_values[at++] = (static_cast<float>(pixel[c]) - mean[c]) / std[c];
                        }
    return out;
}

std::vector<std::array<int, 2>> patch_positions(int grid_h, int grid_w, int merge) {
    std::vector<std::array<int, 2>> out;
    out.reserve(static_cast<size_t>(grid_h) * grid_w);
    for (int by = 0; by < grid_h / merge; ++by)
        for (int bx = 0; bx < grid_w / merge; ++bx)
            for (int dy = 0; dy < merge; ++dy)
                for (int dx = 0; dx < merge; ++dx) out.push_back({by * merge + dy, bx * merge + dx});
    return out;
}

WindowLayout window_layout(int grid_h, int grid_w, int merge, int window_tokens) {
    const int hm = grid_h / merge, wm = grid_w / merge;
    const int nwh = (hm + window_tokens - 1) / window_tokens, nww = (wm + window_tokens - 1) / window_tokens;
    WindowLayout out;
    out.cu_seqlens.push_back(0);
    for (int r = 0; r < nwh; ++r)
        for (int c = 0; c < nww; ++c) {
            const int r1 = std::min(hm, (r + 1) * window_tokens), c1 = std::min(wm, (c + 1) * window_tokens);
            int64_t count = 0;
            for (int y = r * window_tokens; y < r1; ++y)
                for (int x = c * window_tokens; x < c1; ++x, ++count) out.index.push_back(static_cast<int64_t>(y) * wm + x);
            if (count) out.cu_seqlens.push_back(out.cu_seqlens.back() + count * merge * merge);
        }
    return out;
}

std::vector<int64_t> patch_permutation(const std::vector<int64_t>& window_index, int merge_unit) {
    std::vector<int64_t> out;
    out.reserve(window_index.size() * merge_unit);
    for (int64_t t : window_index)
        for (int j = 0; j < merge_unit; ++j) out.push_back(t * merge_unit + j);
    return out;
}

std::vector<float> inv_freq(int rotary_dim, double theta) {
    if (rotary_dim <= 0 || rotary_dim % 2) throw ProcessorError("rotary dim " + std::to_string(rotary_dim) + " must be even");
    std::vector<float> out;
    for (int i = 0; i < rotary_dim; i += 2) {
        const float exponent = static_cast<float>(i) / static_cast<float>(rotary_dim);
        out.push_back(1.0f / std::pow(static_cast<float>(theta), exponent));
    }
    return out;
}

namespace {

float cos32(float angle) { return static_cast<float>(std::cos(static_cast<double>(angle))); }
float sin32(float angle) { return static_cast<float>(std::sin(static_cast<double>(angle))); }

}  // namespace

void cos_sin(const std::vector<int64_t>& positions, const std::vector<float>& freqs, std::vector<float>& cos,
             std::vector<float>& sin) {
    const size_t half = freqs.size(), row = 2 * half;
    cos.assign(positions.size() * row, 0.0f);
    sin.assign(cos.size(), 0.0f);
    for (size_t p = 0; p < positions.size(); ++p)
        for (size_t i = 0; i < half; ++i) {
            const float angle = static_cast<float>(positions[p]) * freqs[i];
            for (size_t r : {i, i + half}) {
                cos[p * row + r] = cos32(angle);
                sin[p * row + r] = sin32(angle);
            }
        }
}

void axial_cos_sin(const std::vector<std::array<int, 2>>& positions, const std::vector<float>& freqs,
                   std::vector<float>& cos, std::vector<float>& sin) {
    const size_t q = freqs.size(), row = 4 * q;
    cos.assign(positions.size() * row, 0.0f);
    sin.assign(cos.size(), 0.0f);
    for (size_t p = 0; p < positions.size(); ++p)
        for (int axis = 0; axis < 2; ++axis)
            for (size_t i = 0; i < q; ++i) {
                const float angle = static_cast<float>(positions[p][axis]) * freqs[i];
                for (size_t r : {axis * q + i, 2 * q + axis * q + i}) {
                    cos[p * row + r] = cos32(angle);
                    sin[p * row + r] = sin32(angle);
                }
            }
}

}  // namespace ncnnport::youtu
