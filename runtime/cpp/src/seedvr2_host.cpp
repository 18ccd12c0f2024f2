// Each function names the Python it mirrors; float32 expressions keep the Python evaluation
// order term by term (numpy/torch evaluate left to right, one rounding per operation).
#include "ncnnport/seedvr2_host.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace ncnnport::seedvr2 {
namespace {

// Python's round() and numpy's rint: half to even (the default FE_TONEAREST mode).
double round_half_even(double v) { return std::nearbyint(v); }

const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& where) {
    if (!obj.is_object() || !obj.contains(key)) throw std::runtime_error(where + ": field " + key + " is missing");
    return obj.at(key);
}

template <typename T>
T number(const nlohmann::json& obj, const char* key, const std::string& where) {
    const nlohmann::json& v = field(obj, key, where);
    if (!v.is_number()) throw std::runtime_error(where + ": field " + key + " is not a number");
    return v.get<T>();
}

// host_numpy._fma: float32 a * b + c through double (the product is exact there), as ATen's
// FMA-contracted CPU kernels compute it; rounding through double keeps this bit-equal to numpy.
float fma_f(float a, float b, float c) {
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
}

// host_numpy._cubic: Keys' cubic, a = -0.5, float32, ATen's Horner form with fused steps.
float cubic(float x) {
    x = std::fabs(x);
    const float a = -0.5f;
    if (x < 1.f) {
        const float u = fma_f(a + 2.f, x, -(a + 3.f));
        return fma_f(u * x, x, 1.f);
    }
    if (x < 2.f) {
        const float p = fma_f(a, x, -5.f * a);
        const float q = fma_f(p, x, 8.f * a);
        return fma_f(q, x, -4.f * a);
    }
    return 0.f;
}

struct AxisWeights {
    std::vector<int64_t> start;       // first input index per output
    std::vector<std::vector<float>> w;  // normalised taps per output
    size_t taps = 0;                  // max taps (shorter rows are padded with weight-0 taps at 0)
};

// host_numpy.aa_weights: centre in double stored as float, bounds in double, taps summed in
// float32 one by one.
AxisWeights aa_weights(int in_size, int out_size) {
    const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
    const float support = scale >= 1.f ? 2.f * scale : 2.f;
    const float invscale = scale >= 1.f ? 1.f / scale : 1.f;
    AxisWeights out;
    for (int i = 0; i < out_size; ++i) {
        const float center = static_cast<float>(static_cast<double>(scale) * (i + 0.5));
        const int xmin = std::max(static_cast<int>(static_cast<double>(center - support) + 0.5), 0);
        const int xsize = std::min(static_cast<int>(static_cast<double>(center + support) + 0.5), in_size) - xmin;
        std::vector<float> w(static_cast<size_t>(std::max(xsize, 0)));
        for (int j = 0; j < xsize; ++j) {
            const float offset = static_cast<float>(j + xmin) - center;
            w[static_cast<size_t>(j)] = cubic(static_cast<float>((static_cast<double>(offset) + 0.5) * static_cast<double>(invscale)));
        }
        float total = 0.f;
        for (float v : w) total = total + v;
        if (total != 0.f)
            for (float& v : w) v = v / total;
        out.taps = std::max(out.taps, w.size());
        out.start.push_back(xmin);
        out.w.push_back(std::move(w));
    }
    return out;
}

// host_numpy._resize_last_axis over rows of length in_size: tap 0 a product, every further tap
// a fused multiply-add (padding taps read index 0 with weight 0, adding an exact 0).
void resize_rows(const float* in, int rows, int in_size, float* out, int out_size, const AxisWeights& aw) {
    for (int r = 0; r < rows; ++r) {
        const float* x = in + static_cast<size_t>(r) * in_size;
        float* y = out + static_cast<size_t>(r) * out_size;
        for (int i = 0; i < out_size; ++i) {
            const auto& w = aw.w[static_cast<size_t>(i)];
            const int64_t start = aw.start[static_cast<size_t>(i)];
            float acc = w.empty() ? x[0] * 0.f : x[start] * w[0];
            for (size_t j = 1; j < aw.taps; ++j)
                acc = j < w.size() ? fma_f(x[start + static_cast<int64_t>(j)], w[j], acc) : fma_f(x[0], 0.f, acc);
            y[i] = acc;
        }
    }
}

Tensor transpose_last2(const Tensor& x) {
    const size_t nd = x.shape.size();
    const int64_t h = x.shape[nd - 2], w = x.shape[nd - 1], planes = x.numel() / (h * w);
    Tensor y;
    y.shape = x.shape;
    std::swap(y.shape[nd - 2], y.shape[nd - 1]);
    y.data.resize(x.data.size());
    for (int64_t p = 0; p < planes; ++p)
        for (int64_t i = 0; i < h; ++i)
            for (int64_t j = 0; j < w; ++j) y.data[(p * w + j) * h + i] = x.data[(p * h + i) * w + j];
    return y;
}

Tensor resize_last(const Tensor& x, int out_size) {
    const int in_size = static_cast<int>(x.shape.back());
    const AxisWeights aw = aa_weights(in_size, out_size);
    Tensor y;
    y.shape = x.shape;
    y.shape.back() = out_size;
    y.data.resize(static_cast<size_t>(y.numel()));
    resize_rows(x.data.data(), static_cast<int>(x.numel() / in_size), in_size, y.data.data(), out_size, aw);
    return y;
}

// pipeline.wavelet_blur / host_numpy.wavelet_blur on one (H, W) plane, edges replicated; the
// nine taps accumulated from zero in (ky, kx) order.
void blur_plane(const float* x, float* out, int h, int w, int radius) {
    static const float k[3][3] = {{1.f / 16, 2.f / 16, 1.f / 16}, {2.f / 16, 4.f / 16, 2.f / 16}, {1.f / 16, 2.f / 16, 1.f / 16}};
    std::fill(out, out + static_cast<size_t>(h) * w, 0.f);
    for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx)
            for (int i = 0; i < h; ++i) {
                const int si = std::clamp(i + (ky - 1) * radius, 0, h - 1);
                for (int j = 0; j < w; ++j) {
                    const int sj = std::clamp(j + (kx - 1) * radius, 0, w - 1);
                    out[static_cast<size_t>(i) * w + j] += k[ky][kx] * x[static_cast<size_t>(si) * w + sj];
                }
            }
}

// wavelet_split on one plane: writes the high part into ``high`` and the low into ``low``.
void wavelet_split_plane(const float* x, int h, int w, std::vector<float>* high, std::vector<float>* low) {
    const size_t n = static_cast<size_t>(h) * w;
    high->assign(n, 0.f);
    low->assign(x, x + n);
    std::vector<float> blurred(n);
    for (int level = 0; level < 5; ++level) {
        blur_plane(low->data(), blurred.data(), h, w, 1 << level);
        for (size_t i = 0; i < n; ++i) (*high)[i] = (*high)[i] + ((*low)[i] - blurred[i]);
        low->swap(blurred);
    }
}

}  // namespace

Tensor zeros(std::vector<int64_t> shape) {
    Tensor t;
    t.shape = std::move(shape);
    t.data.assign(static_cast<size_t>(t.numel()), 0.f);
    return t;
}

bool Config::decode_temporal(int k) const {
    const int n = decode_stages;
    return std::find(temporal_down_blocks.begin(), temporal_down_blocks.end(), n - 2 - k) != temporal_down_blocks.end();
}

Config config_from_model_json(const nlohmann::json& model, const std::string& source) {
    const nlohmann::json& cfg = field(model, "config", source);
    const std::string ds = source + " config.dit", vs = source + " config.vae";
    const nlohmann::json& d = field(cfg, "dit", source + " config");
    const nlohmann::json& v = field(cfg, "vae", source + " config");
    Config c;
    c.vid_in_channels = number<int>(d, "vid_in_channels", ds);
    c.vid_out_channels = number<int>(d, "vid_out_channels", ds);
    c.vid_dim = number<int>(d, "vid_dim", ds);
    c.heads = number<int>(d, "heads", ds);
    c.head_dim = number<int>(d, "head_dim", ds);
    c.num_layers = number<int>(d, "num_layers", ds);
    c.sinusoidal_dim = number<int>(d, "sinusoidal_dim", ds);
    c.rope_theta = number<double>(d, "rope_theta", ds);
    c.window_area = number<int>(d, "window_area", ds);
    c.window_max_t = number<int>(d, "window_max_t", ds);
    const nlohmann::json& win = field(d, "window", ds);
    if (!win.is_array() || win.size() != 3) throw std::runtime_error(ds + ": field window is not 3 numbers");
    for (int i = 0; i < 3; ++i) c.window[static_cast<size_t>(i)] = win.at(static_cast<size_t>(i)).get<int>();
    const std::array<int, 3> patch = field(d, "patch_size", ds).get<std::array<int, 3>>();
    if (patch != std::array<int, 3>{1, 2, 2}) throw std::runtime_error(ds + ": patch_size must be [1, 2, 2]");
    c.latent_channels = number<int>(v, "latent_channels", vs);
    c.decode_stages = static_cast<int>(field(v, "block_out_channels", vs).size());
    c.temporal_down_blocks = field(v, "temporal_down_blocks", vs).get<std::vector<int>>();
    c.scaling_factor = number<double>(v, "scaling_factor", vs);
    c.timestep = number<double>(cfg, "timestep", source + " config");
    c.schedule_T = number<double>(cfg, "schedule_T", source + " config");
    c.text_len = number<int>(cfg, "text_len", source + " config");
    if (c.decode_stages < 1 || c.head_dim % 2 || c.heads < 1 || c.num_layers < 1)
        throw std::runtime_error(source + ": config has impossible dimensions");
    return c;
}

std::pair<int, int> area_size(int h, int w, int64_t area) {
    const double scale = std::sqrt(static_cast<double>(area) / (static_cast<double>(h) * w));
    return {std::max(1, static_cast<int>(round_half_even(h * scale))), std::max(1, static_cast<int>(round_half_even(w * scale)))};
}

int centre_offset(int size, int crop) { return static_cast<int>(round_half_even((size - crop) / 2.0)); }

Tensor resize_bicubic_aa(const Tensor& x, int height, int width) {
    const size_t nd = x.shape.size();
    Tensor y = x.shape[nd - 1] != width ? resize_last(x, width) : x;
    if (y.shape[nd - 2] != height) y = transpose_last2(resize_last(transpose_last2(y), height));
    return y;
}

Tensor preprocess(const std::vector<uint8_t>& frames, int t, int h, int w, int64_t area, int multiple) {
    // uint8 (T,H,W,3) -> float (T*3, H, W) / 255
    Tensor x;
    x.shape = {t, 3, h, w};
    x.data.resize(static_cast<size_t>(x.numel()));
    for (int f = 0; f < t; ++f)
        for (int c = 0; c < 3; ++c)
            for (int i = 0; i < h * w; ++i)
                x.data[(static_cast<size_t>(f) * 3 + c) * h * w + i] =
                    static_cast<float>(frames[(static_cast<size_t>(f) * h * w + i) * 3 + c]) / 255.f;
    const auto [nh, nw] = area_size(h, w, area);
    if (nh != h || nw != w) x = resize_bicubic_aa(x, nh, nw);
    for (float& v : x.data) v = std::min(std::max(v, 0.f), 1.f);
    const int ch = nh - nh % multiple, cw = nw - nw % multiple;
    if (ch == 0 || cw == 0)
        throw std::runtime_error("resized frame " + std::to_string(nh) + "x" + std::to_string(nw) +
                                 " is smaller than " + std::to_string(multiple) + " px");
    const int top = centre_offset(nh, ch), left = centre_offset(nw, cw);
    const int tp = t + ((-(t - 1)) % 4 + 4) % 4;
    Tensor out;
    out.shape = {3, tp, ch, cw};
    out.data.resize(static_cast<size_t>(out.numel()));
    for (int c = 0; c < 3; ++c)
        for (int f = 0; f < tp; ++f) {
            const int sf = std::min(f, t - 1);
            for (int i = 0; i < ch; ++i)
                for (int j = 0; j < cw; ++j) {
                    const float v = x.data[((static_cast<size_t>(sf) * 3 + c) * nh + top + i) * nw + left + j];
                    out.data[((static_cast<size_t>(c) * tp + f) * ch + i) * cw + j] = v * 2.f - 1.f;
                }
        }
    return out;
}

Tensor posterior_latent(const Tensor& mean, const Tensor& logvar, const Tensor* eps, double scale) {
    Tensor z;
    z.shape.assign(mean.shape.begin() + 1, mean.shape.end());
    z.data.resize(mean.data.size());
    const float s = static_cast<float>(scale);
    for (size_t i = 0; i < z.data.size(); ++i) {
        float v = mean.data[i];
        if (eps) v = v + static_cast<float>(std::exp(static_cast<double>(0.5f * logvar.data[i]))) * eps->data[i];
        z.data[i] = v * s;
    }
    return z;
}

Tensor channels_last(const Tensor& x) {
    const int64_t c = x.shape[0], rest = x.numel() / c;
    Tensor y;
    y.shape = {x.shape[1], x.shape[2], x.shape[3], c};
    y.data.resize(x.data.size());
    for (int64_t k = 0; k < c; ++k)
        for (int64_t i = 0; i < rest; ++i) y.data[i * c + k] = x.data[k * rest + i];
    return y;
}

Tensor channels_first(const Tensor& x) {
    const int64_t c = x.shape[3], rest = x.numel() / c;
    Tensor y;
    y.shape = {c, x.shape[0], x.shape[1], x.shape[2]};
    y.data.resize(x.data.size());
    for (int64_t k = 0; k < c; ++k)
        for (int64_t i = 0; i < rest; ++i) y.data[k * rest + i] = x.data[i * c + k];
    return y;
}

Tensor build_condition(const Tensor& x_T, const Tensor& lq) {
    const int64_t c = x_T.shape[3], rest = x_T.numel() / c;
    Tensor y;
    y.shape = {x_T.shape[0], x_T.shape[1], x_T.shape[2], 2 * c + 1};
    y.data.resize(static_cast<size_t>(y.numel()));
    for (int64_t i = 0; i < rest; ++i) {
        float* o = &y.data[i * (2 * c + 1)];
        std::copy_n(&x_T.data[i * c], c, o);
        std::copy_n(&lq.data[i * c], c, o + c);
        o[2 * c] = 1.f;
    }
    return y;
}

Tensor euler_x0(const Tensor& x_T, const Tensor& v, double timestep, double schedule_T) {
    const float ratio = static_cast<float>(timestep / schedule_T);
    Tensor y = x_T;
    for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = x_T.data[i] - v.data[i] * ratio;
    return y;
}

Tensor patchify(const Tensor& vid) {
    const int64_t t = vid.shape[0], h = vid.shape[1], w = vid.shape[2], c = vid.shape[3];
    Tensor y;
    y.shape = {1, t * (h / 2) * (w / 2), 4 * c};
    y.data.resize(static_cast<size_t>(y.numel()));
    size_t o = 0;
    for (int64_t f = 0; f < t; ++f)
        for (int64_t i = 0; i < h / 2; ++i)
            for (int64_t j = 0; j < w / 2; ++j)
                for (int64_t py = 0; py < 2; ++py)
                    for (int64_t px = 0; px < 2; ++px)
                        for (int64_t k = 0; k < c; ++k)
                            y.data[o++] = vid.data[((f * h + 2 * i + py) * w + 2 * j + px) * c + k];
    return y;
}

Tensor unpatchify(const Tensor& x, std::array<int, 3> grid, int c) {
    const int64_t t = grid[0], h = grid[1], w = grid[2];
    Tensor y;
    y.shape = {t, 2 * h, 2 * w, c};
    y.data.resize(static_cast<size_t>(y.numel()));
    size_t o = 0;
    for (int64_t f = 0; f < t; ++f)
        for (int64_t i = 0; i < h; ++i)
            for (int64_t j = 0; j < w; ++j)
                for (int64_t py = 0; py < 2; ++py)
                    for (int64_t px = 0; px < 2; ++px)
                        for (int64_t k = 0; k < c; ++k)
                            y.data[((f * 2 * h + 2 * i + py) * 2 * w + 2 * j + px) * c + k] = x.data[o++];
    return y;
}

Tensor timestep_sinusoid(double t, int dim) {
    const int half = dim / 2;
    const float neg_log = static_cast<float>(-std::log(10000.0));
    Tensor y = zeros({1, dim});
    for (int i = 0; i < half; ++i) {
        const float f = static_cast<float>(std::exp(static_cast<double>(neg_log * static_cast<float>(i) / static_cast<float>(half))));
        const float arg = static_cast<float>(t) * f;
        y.data[static_cast<size_t>(i)] = static_cast<float>(std::sin(static_cast<double>(arg)));
        y.data[static_cast<size_t>(half + i)] = static_cast<float>(std::cos(static_cast<double>(arg)));
    }
    return y;
}

std::array<int, 3> window_sizes(std::array<int, 3> grid, std::array<int, 3> num, int area, int max_t) {
    const auto [t, h, w] = grid;
    const double scale = std::sqrt(static_cast<double>(area) / (static_cast<double>(h) * w));
    const double rh = round_half_even(h * scale), rw = round_half_even(w * scale);
    return {static_cast<int>(std::ceil(static_cast<double>(std::min(t, max_t)) / num[0])),
            static_cast<int>(std::ceil(rh / num[1])), static_cast<int>(std::ceil(rw / num[2]))};
}

std::vector<std::pair<int, int>> axis_intervals(int n, int size, bool shifted) {
    double s = 0.0;
    int count;
    if (shifted && size < n) {
        s = 0.5;
        count = static_cast<int>(std::ceil((n - s) / size)) + 1;
    } else {
        count = static_cast<int>(std::ceil(static_cast<double>(n) / size));
    }
    std::vector<std::pair<int, int>> out;
    for (int i = 0; i < count; ++i) {
        const int a = std::max(static_cast<int>((i - s) * size), 0);
        const int b = std::min(static_cast<int>((i - s + 1) * size), n);
        if (b > a) out.emplace_back(a, b);
    }
    return out;
}

std::vector<Window> partition(std::array<int, 3> grid, bool shifted, const Config& cfg) {
    const auto sizes = window_sizes(grid, cfg.window, cfg.window_area, cfg.window_max_t);
    const auto ts = axis_intervals(grid[0], sizes[0], shifted);
    const auto hs = axis_intervals(grid[1], sizes[1], shifted);
    const auto ws = axis_intervals(grid[2], sizes[2], shifted);
    std::vector<Window> out;  // w outermost, t innermost (windows.partition)
    for (const auto& iw : ws)
        for (const auto& ih : hs)
            for (const auto& it : ts) out.push_back({{it.first, ih.first, iw.first}, {it.second, ih.second, iw.second}});
    return out;
}

std::pair<Tensor, Tensor> rope_tables(const std::vector<std::array<int64_t, 3>>& pos, const Config& cfg) {
    const int hd = cfg.head_dim, ad = cfg.rope_axis_dim();
    std::vector<float> freqs(static_cast<size_t>(ad / 2));
    const float theta = static_cast<float>(cfg.rope_theta);
    for (int k = 0; k < ad / 2; ++k) {
        const float e = static_cast<float>(2 * k) / static_cast<float>(ad);
        freqs[static_cast<size_t>(k)] = 1.f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    }
    // pair layout channel (a*ad + 2k + {0,1}) -> rotate-half: evens first, then odds
    const int64_t n = static_cast<int64_t>(pos.size());
    Tensor c = zeros({1, n, hd}), s = zeros({1, n, hd});
    std::vector<float> cp(static_cast<size_t>(hd)), sp(static_cast<size_t>(hd));
    for (int64_t r = 0; r < n; ++r) {
        for (int ch = 0; ch < hd; ++ch) {
            cp[static_cast<size_t>(ch)] = 1.f;
            sp[static_cast<size_t>(ch)] = 0.f;
        }
        for (int a = 0; a < 3; ++a)
            for (int k = 0; k < ad / 2; ++k) {
                const float ang = static_cast<float>(pos[static_cast<size_t>(r)][static_cast<size_t>(a)]) * freqs[static_cast<size_t>(k)];
                const float cv = static_cast<float>(std::cos(static_cast<double>(ang)));
                const float sv = static_cast<float>(std::sin(static_cast<double>(ang)));
                for (int p = 0; p < 2; ++p) {
                    cp[static_cast<size_t>(a * ad + 2 * k + p)] = cv;
                    sp[static_cast<size_t>(a * ad + 2 * k + p)] = sv;
                }
            }
        for (int ch = 0; ch < hd; ++ch) {
            const int src = ch < hd / 2 ? 2 * ch : 2 * (ch - hd / 2) + 1;
            c.data[static_cast<size_t>(r * hd + ch)] = cp[static_cast<size_t>(src)];
            const float sv = sp[static_cast<size_t>(src)];
            s.data[static_cast<size_t>(r * hd + ch)] = ch < hd / 2 ? sv * -1.f : sv;
        }
    }
    return {c, s};
}

Plan make_plan(std::array<int, 3> grid, bool shifted, const Config& cfg, bool swap_hw_positions) {
    const std::vector<Window> wins = partition(grid, shifted, cfg);
    const int64_t n = static_cast<int64_t>(grid[0]) * grid[1] * grid[2];
    std::vector<std::array<int64_t, 3>> pos(static_cast<size_t>(n));
    Plan plan;
    for (const Window& win : wins) {
        std::vector<int64_t> idx;
        for (int t = win.start[0]; t < win.stop[0]; ++t)
            for (int h = win.start[1]; h < win.stop[1]; ++h)
                for (int w = win.start[2]; w < win.stop[2]; ++w) {
                    const int64_t flat = (static_cast<int64_t>(t) * grid[1] + h) * grid[2] + w;
                    idx.push_back(flat);
                    const int64_t ph = h - win.start[1], pw = w - win.start[2];
                    pos[static_cast<size_t>(flat)] = {t - win.start[0] + cfg.text_len, swap_hw_positions ? pw : ph,
                                                      swap_hw_positions ? ph : pw};
                }
        plan.index.push_back(std::move(idx));
    }
    std::tie(plan.cos_v, plan.sin_v) = rope_tables(pos, cfg);
    return plan;
}

std::pair<Tensor, Tensor> text_tables(int text_len, const Config& cfg) {
    std::vector<std::array<int64_t, 3>> pos;
    for (int i = 0; i < text_len; ++i) pos.push_back({i, i, i});
    return rope_tables(pos, cfg);
}

Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows) {
    const int64_t row = x.numel() / x.shape[1];
    Tensor y;
    y.shape = x.shape;
    y.shape[1] = static_cast<int64_t>(rows.size());
    y.data.resize(static_cast<size_t>(y.numel()));
    for (size_t r = 0; r < rows.size(); ++r) std::copy_n(&x.data[rows[r] * row], row, &y.data[r * row]);
    return y;
}

Tensor concat_rows(const Tensor& a, const Tensor& b) {
    Tensor y;
    y.shape = a.shape;
    y.shape[1] = a.shape[1] + b.shape[1];
    y.data = a.data;
    y.data.insert(y.data.end(), b.data.begin(), b.data.end());
    return y;
}

Tensor depth_to_space(const Tensor& y, bool temporal) {
    const int64_t ch = y.shape[1], f = y.shape[2], h = y.shape[3], w = y.shape[4];
    const int64_t z = temporal ? 2 : 1, c = ch / (4 * z), fo = temporal ? 2 * f - 1 : f;
    Tensor out;
    out.shape = {1, c, fo, 2 * h, 2 * w};
    out.data.resize(static_cast<size_t>(out.numel()));
    // input channel (x, y, [z], c): x row phase, y column phase, z time phase
    for (int64_t k = 0; k < c; ++k)
        for (int64_t fi = 0; fi < f; ++fi)
            for (int64_t zi = 0; zi < z; ++zi) {
                const int64_t of = temporal ? fi * 2 + zi : fi;
                if (temporal && of == 1) continue;  // the space-time variant drops output frame 1
                const int64_t dst_f = temporal && of > 1 ? of - 1 : of;
                for (int64_t xi = 0; xi < 2; ++xi)
                    for (int64_t yi = 0; yi < 2; ++yi) {
                        const int64_t src_c = ((xi * 2 + yi) * z + zi) * c + k;
                        for (int64_t i = 0; i < h; ++i)
                            for (int64_t j = 0; j < w; ++j)
                                out.data[(((k * fo + dst_f) * 2 * h) + 2 * i + xi) * 2 * w + 2 * j + yi] =
                                    y.data[((src_c * f + fi) * h + i) * w + j];
                    }
            }
    return out;
}

Tensor wavelet_color_fix(const Tensor& output, const Tensor& source) {
    const int64_t t = output.shape[1], h = output.shape[2], w = output.shape[3];
    Tensor res = output;
    std::vector<float> high, low, shigh, slow;
    for (int64_t c = 0; c < 3; ++c)
        for (int64_t f = 0; f < t; ++f) {
            const size_t off = static_cast<size_t>((c * t + f) * h * w);
            wavelet_split_plane(&output.data[off], static_cast<int>(h), static_cast<int>(w), &high, &low);
            wavelet_split_plane(&source.data[off], static_cast<int>(h), static_cast<int>(w), &shigh, &slow);
            for (size_t i = 0; i < high.size(); ++i) res.data[off + i] = high[i] + slow[i];
        }
    return res;
}

std::vector<uint8_t> to_uint8(const Tensor& x, int frames) {
    const int64_t t = x.shape[1], h = x.shape[2], w = x.shape[3];
    std::vector<uint8_t> out(static_cast<size_t>(frames * h * w * 3));
    for (int64_t f = 0; f < frames && f < t; ++f)
        for (int64_t i = 0; i < h * w; ++i)
            for (int64_t c = 0; c < 3; ++c) {
                float y = std::min(std::max(x.data[static_cast<size_t>((c * t + f) * h * w + i)], -1.f), 1.f);
                y = (y * 0.5f + 0.5f) * 255.f;
                out[static_cast<size_t>((f * h * w + i) * 3 + c)] = static_cast<uint8_t>(round_half_even(y));
            }
    return out;
}

}  // namespace ncnnport::seedvr2
