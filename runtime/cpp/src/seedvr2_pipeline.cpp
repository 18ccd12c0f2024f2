#include "ncnnport/seedvr2_pipeline.h"

#include <chrono>
#include <fstream>
#include <regex>

namespace ncnnport::seedvr2 {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The seconds of one graph stage (vae_encode, dit, vae_decode) without the graph loads that
// happen inside it: graphs load lazily on first use and are released after it, and on Vulkan a
// load (weight upload, pipeline creation) can take longer than the stage's compute, so a stage
// timer that included it would not say what the stage costs. Loads count in load_graphs alone.
class StageClock {
public:
    explicit StageClock(Timings* timings) : timings_(timings), t0_(Clock::now()), loads0_(loads()) {}
    void stop(const char* stage) { timings_->seconds[stage] += since(t0_) - (loads() - loads0_); }

private:
    double loads() const {
        const auto it = timings_->seconds.find("load_graphs");
        return it == timings_->seconds.end() ? 0.0 : it->second;
    }
    Timings* timings_;
    Clock::time_point t0_;
    double loads0_;
};

std::string block_name(int i, const char* part) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "dit_block_%02d_%s", i, part);
    return buf;
}

// runner.GraphBackend._attention: per window [its video rows, all text rows] -> scatter the
// video rows back, sum the text rows over windows (from zero, window order) and divide.
std::pair<Tensor, Tensor> windowed_attention(Graph& attn, const std::vector<Tensor>& qkv, const Plan& plan) {
    const Tensor &qv = qkv[0], &kv = qkv[1], &vv = qkv[2], &qt = qkv[3], &kt = qkv[4], &vt = qkv[5];
    Tensor out_v = zeros(qv.shape), acc_t = zeros(qt.shape);
    const int64_t row = qv.numel() / qv.shape[1];
    for (const std::vector<int64_t>& idx : plan.index) {
        const Tensor q = concat_rows(gather_rows(qv, idx), qt);
        const Tensor k = concat_rows(gather_rows(kv, idx), kt);
        const Tensor v = concat_rows(gather_rows(vv, idx), vt);
        const Tensor o = attn.run({{"q", &q}, {"k", &k}, {"v", &v}})[0];
        const int64_t n = static_cast<int64_t>(idx.size());
        for (int64_t r = 0; r < n; ++r) std::copy_n(&o.data[r * row], row, &out_v.data[idx[static_cast<size_t>(r)] * row]);
        for (size_t i = 0; i < acc_t.data.size(); ++i) acc_t.data[i] = acc_t.data[i] + o.data[n * row + i];
    }
    const float count = static_cast<float>(plan.index.size());
    for (float& x : acc_t.data) x = x / count;
    return {out_v, acc_t};
}

Tensor as_rows(Tensor t) {  // (1, N, heads, hd) -> (1, N, heads*hd)
    t.shape = {1, t.shape[1], t.numel() / t.shape[1]};
    return t;
}

}  // namespace

Pipeline::Pipeline(std::filesystem::path package, const RunOptions& options)
    : package_(std::move(package)), options_(options) {
    const auto model_path = package_ / "model.json";
    std::ifstream in(model_path);
    if (!in) throw std::runtime_error(model_path.string() + ": missing (not a SeedVR2 package?)");
    model_ = nlohmann::json::parse(in, nullptr, false);
    if (model_.is_discarded() || !model_.is_object()) throw std::runtime_error(model_path.string() + ": not a JSON object");
    cfg_ = config_from_model_json(model_, model_path.string());
    const auto files = model_.value("files", nlohmann::json::object());
    if (!files.contains("text_embedding") || !files["text_embedding"].is_string())
        throw std::runtime_error(model_path.string() + ": field files.text_embedding is missing");
    text_ = read_npy(package_ / files["text_embedding"].get<std::string>());
    if (text_.shape.size() != 2) throw std::runtime_error(model_path.string() + ": text embedding is not (L, dim)");
    text_.shape.insert(text_.shape.begin(), 1);
}

int64_t Pipeline::default_area(int h, int w) const {
    const std::string where = (package_ / "model.json").string() + " preprocessing.area";
    const auto pre = model_.value("preprocessing", nlohmann::json::object());
    if (!pre.contains("area") || !pre["area"].is_string()) throw std::runtime_error(where + ": missing; pass --area");
    const std::string rule = pre["area"].get<std::string>();
    std::smatch m;
    if (std::regex_search(rule, m, std::regex(R"(own area, at most (\d+) px)")))
        return std::min<int64_t>(static_cast<int64_t>(h) * w, std::stoll(m[1]));
    if (std::regex_match(rule, m, std::regex(R"((\d+) px\b.*)"))) return std::stoll(m[1]);
    throw std::runtime_error(where + ": rule '" + rule + "' not understood; pass --area");
}

std::vector<int64_t> Pipeline::latent_shape(int t, int h, int w, int64_t area) const {
    const auto [nh, nw] = area_size(h, w, area);
    const int frames = t + ((-(t - 1)) % 4 + 4) % 4;
    const int s = cfg_.spatial_factor();
    return {cfg_.latent_channels, cfg_.latent_frames(frames), (nh - nh % 16) / s, (nw - nw % 16) / s};
}

Graph& Pipeline::graph(const std::string& name, Timings* timings) {
    auto it = graphs_.find(name);
    if (it == graphs_.end()) {
        const auto t0 = Clock::now();
        it = graphs_.emplace(name, std::make_unique<Graph>(package_, name, options_)).first;
        timings->seconds["load_graphs"] += since(t0);
        timings->graphs.push_back(name);
    }
    return *it->second;
}

std::string Pipeline::vae_graph(const std::string& name, int64_t frames) const {
    const std::string twin = name + "_image";
    if (frames == 1 && std::filesystem::is_regular_file(package_ / "specs" / (twin + ".spec.json"))) return twin;
    return name;
}

Tensor Pipeline::dit(const Tensor& cond, Timings* timings, const Perturb& perturb) {
    const std::array<int, 3> grid{static_cast<int>(cond.shape[0]), static_cast<int>(cond.shape[1] / 2),
                                  static_cast<int>(cond.shape[2] / 2)};
    auto t0 = Clock::now();
    const Tensor patches = patchify(cond);
    const Tensor sinus = timestep_sinusoid(cfg_.timestep, cfg_.sinusoidal_dim);
    const Plan plans[2] = {make_plan(grid, false, cfg_, perturb.flip_rope_h_w), make_plan(grid, true, cfg_, perturb.flip_rope_h_w)};
    auto [cos_t, sin_t] = text_tables(static_cast<int>(text_.shape[1]), cfg_);
    timings->seconds["host_dit"] += since(t0);

    StageClock clock(timings);
    auto io = graph("dit_input", timings).run({{"vid", &patches}, {"txt", &text_}});
    Tensor vid = io[0], tx = io[1];
    const Tensor emb6 = graph("dit_embedding", timings).run({{"sinus", &sinus}})[0];
    for (int i = 0; i < cfg_.num_layers; ++i) {
        const Plan& plan = plans[(i % 2) ^ (perturb.swap_shift ? 1 : 0)];
        const auto qkv = graph(block_name(i, "pre"), timings)
                             .run({{"vid", &vid}, {"txt", &tx}, {"emb6", &emb6}, {"cos_v", &plan.cos_v},
                                   {"sin_v", &plan.sin_v}, {"cos_t", &cos_t}, {"sin_t", &sin_t}});
        auto [attn_v, attn_t] = windowed_attention(graph("dit_attention", timings), qkv, plan);
        attn_v = as_rows(std::move(attn_v));
        attn_t = as_rows(std::move(attn_t));
        auto out = graph(block_name(i, "post"), timings)
                       .run({{"vid", &vid}, {"txt", &tx}, {"emb6", &emb6}, {"attn_v", &attn_v}, {"attn_t", &attn_t}});
        vid = std::move(out[0]);
        if (out.size() > 1) tx = std::move(out[1]);
        release(block_name(i, "pre"));
        release(block_name(i, "post"));
    }
    const Tensor out = graph("dit_output", timings).run({{"vid", &vid}, {"emb6", &emb6}})[0];
    clock.stop("dit");
    Tensor rows = out;
    rows.shape.erase(rows.shape.begin());
    return unpatchify(rows, grid, cfg_.vid_out_channels);
}

Tensor Pipeline::decode(const Tensor& z, Timings* timings) {
    StageClock clock(timings);
    Tensor x = z;  // (1, C, f, h, w); one frame stays one through every stage (2f - 1 = 1)
    const int64_t frames = x.shape.at(2);
    for (int k = 0; k < cfg_.decode_stages; ++k) {
        const std::string name = vae_graph("vae_decode_" + std::to_string(k), frames);
        x = graph(name, timings).run({{"x", &x}})[0];
        release(name);
        if (k < cfg_.decode_stages - 1) x = depth_to_space(x, cfg_.decode_temporal(k));
    }
    clock.stop("vae_decode");
    return x;
}

void Pipeline::dump(const std::string& stage, const Tensor& t) const {
    if (!dump_dir_.empty()) write_npy(dump_dir_ / (stage + ".npy"), t);
}

Frames Pipeline::restore(const Frames& input, const Noise& noise, int64_t area, bool colour_fix, Timings* timings,
                         const Perturb& perturb) {
    const auto t_all = Clock::now();
    auto t0 = Clock::now();
    Tensor x = preprocess(input.rgb, input.t, input.h, input.w, area);  // (3, T, H, W)
    timings->seconds["host_preprocess"] += since(t0);
    dump("input", x);
    const std::vector<int64_t> lat = {cfg_.latent_channels, cfg_.latent_frames(static_cast<int>(x.shape[1])),
                                      x.shape[2] / cfg_.spatial_factor(), x.shape[3] / cfg_.spatial_factor()};
    auto shape_err = [&](const char* what, const std::vector<int64_t>& got) {
        std::string s = std::string("noise ") + what + " has shape (";
        for (size_t i = 0; i < got.size(); ++i) s += (i ? ", " : "") + std::to_string(got[i]);
        s += "), the latent is (";
        for (size_t i = 0; i < lat.size(); ++i) s += (i ? ", " : "") + std::to_string(lat[i]);
        return std::invalid_argument(s + ")");
    };
    if (noise.x_T.shape != lat) throw shape_err("x_T", noise.x_T.shape);
    if (noise.posterior && noise.posterior->shape != lat) throw shape_err("posterior", noise.posterior->shape);

    StageClock encode_clock(timings);
    Tensor batch = x;
    batch.shape.insert(batch.shape.begin(), 1);
    const std::string encoder = vae_graph("vae_encode", batch.shape.at(2));
    auto moments = graph(encoder, timings).run({{"x", &batch}});
    release(encoder);
    dump("posterior_mean", moments[0]);
    dump("posterior_logvar", moments[1]);
    encode_clock.stop("vae_encode");

    t0 = Clock::now();
    const Tensor latent = posterior_latent(moments[0], moments[1], noise.posterior ? &*noise.posterior : nullptr,
                                           cfg_.scaling_factor);
    dump("latent", latent);
    const Tensor x_T = channels_last(noise.x_T);
    const Tensor cond = build_condition(x_T, channels_last(latent));
    timings->seconds["host_latent"] += since(t0);

    const Tensor v = dit(cond, timings, perturb);
    dump("velocity", v);

    t0 = Clock::now();
    Tensor x0 = euler_x0(x_T, v, cfg_.timestep, cfg_.schedule_T);
    dump("x0", x0);
    const float sf = static_cast<float>(cfg_.scaling_factor);
    for (float& e : x0.data) e = e / sf;
    Tensor z = channels_first(x0);
    z.shape.insert(z.shape.begin(), 1);
    timings->seconds["host_euler"] += since(t0);

    Tensor dec = decode(z, timings);
    dump("decoded", dec);
    dec.shape.erase(dec.shape.begin());  // (3, T, H, W), unclipped
    t0 = Clock::now();
    if (colour_fix) dec = wavelet_color_fix(dec, x);
    Frames out;
    out.t = input.t;
    out.h = static_cast<int>(dec.shape[2]);
    out.w = static_cast<int>(dec.shape[3]);
    out.rgb = to_uint8(dec, input.t);
    timings->seconds["host_colour_fix_uint8"] += since(t0);
    timings->seconds["total"] += since(t_all);
    return out;
}

}  // namespace ncnnport::seedvr2
