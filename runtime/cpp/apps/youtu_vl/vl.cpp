#include "vl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ncnnport/greedy.h"
#include "ncnnport/huge_page_allocator.h"
#include "ncnnport/model_json.h"
#include "ncnnport/precision.h"

namespace youtu_vl {

using ncnnport::GraphError;
using ncnnport::PackageError;
using ncnnport::Tensor;

namespace {

constexpr float kMasked = -1e30f;  // runtime/masks.MASKED

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int as_int(const ncnnport::JsonFile& f, const std::string& field) {
    const int64_t v = f.integer(field);
    if (v < 0 || v > (int64_t{1} << 30)) f.fail(field, "is out of range");
    return static_cast<int>(v);
}

// The MLA latent cache of every layer (pipeline.LatentCache): per layer a latent [cap, rank] and
// a rotated key [cap, rope] Mat, row 0 a zero dummy that past_mask always hides. The past handed
// to a layer is a 3-D header (c = 1, h = length) over the first `length` rows (shared memory and
// reference count, so ncnn reads it in place and clones before any in-place write); a layer
// returns only its new rows ([1, 1, rows, width]), copied in here and made visible by commit().
class LatentCache {
public:
    LatentCache(int layers, int rank, int rope, int capacity) : capacity_(capacity), pending_(layers, 0) {
        for (int i = 0; i < layers; ++i) {
            // on huge pages (huge_page_allocator.h): each step streams the past once
            latent_.emplace_back(rank, capacity, 4u, ncnnport::huge_page_allocator());
            krot_.emplace_back(rope, capacity, 4u, ncnnport::huge_page_allocator());
            if (latent_.back().empty() || krot_.back().empty())
                throw GraphError("latent cache: ncnn could not allocate " + std::to_string(capacity) + " rows");
            latent_.back().fill(0.0f);
            krot_.back().fill(0.0f);
        }
    }
    ncnn::Mat past_latent(int layer) const { return view(latent_.at(layer)); }
    ncnn::Mat past_krot(int layer) const { return view(krot_.at(layer)); }
    // The graph's outputs `latent` / `krot`: the new rows, [1, 1, rows, width].
    void write(int layer, const Tensor& latent, const Tensor& krot) {
        const int rows = copy_rows(latent_.at(layer), latent, "latent", layer);
        if (copy_rows(krot_.at(layer), krot, "krot", layer) != rows)
            throw GraphError("latent cache layer " + std::to_string(layer) + ": latent and krot rows differ");
        pending_.at(layer) = rows;
    }
    void commit(int added) {
        for (size_t i = 0; i < pending_.size(); ++i)
            if (pending_[i] != added)
                throw GraphError("latent cache: layer " + std::to_string(i) + " wrote " + std::to_string(pending_[i])
                                 + " rows, commit of " + std::to_string(added));
        length_ += added;
        std::fill(pending_.begin(), pending_.end(), 0);
    }
    int seen() const { return length_ - 1; }  // real tokens cached (the dummy row excluded)

private:
    ncnn::Mat view(const ncnn::Mat& full) const {
        ncnn::Mat header = full;  // shares data and reference count
        header.dims = 3;  // [1, 1, length, width] with the batch axis dropped: c = 1, h = length
        header.h = length_;
        header.d = 1;
        header.c = 1;
        header.cstep = static_cast<size_t>(full.w) * length_;
        return header;
    }
    int copy_rows(ncnn::Mat& dst, const Tensor& t, const char* what, int layer) const {
        const std::string where = "latent cache layer " + std::to_string(layer) + " " + what;
        if (t.shape.size() != 4 || t.shape[0] != 1 || t.shape[1] != 1 || t.shape[3] != dst.w || t.shape[2] < 1)
            throw GraphError(where + ": output is not [1, 1, rows, " + std::to_string(dst.w) + "]");
        const int rows = static_cast<int>(t.shape[2]);
        if (length_ + rows > capacity_)
            throw GraphError(where + ": " + std::to_string(length_ + rows) + " rows exceed the capacity " + std::to_string(capacity_));
        const float* src = t.data.data();
        for (size_t j = 0; j < static_cast<size_t>(rows) * dst.w; ++j)
            if (!std::isfinite(src[j])) throw GraphError(where + ": non-finite value from the graph");
        std::memcpy(dst.row(length_), src, static_cast<size_t>(rows) * dst.w * sizeof(float));
        return rows;
    }

    int capacity_;
    int length_ = 1;  // the dummy row
    std::vector<ncnn::Mat> latent_, krot_;
    std::vector<int> pending_;
};

// [rows, width] row-major floats as a [1, rows, width] Mat.
ncnn::Mat rows_mat(const float* data, int rows, int width) {
    Tensor t{{1, rows, width}, std::vector<float>(data, data + static_cast<size_t>(rows) * width)};
    return ncnnport::to_mat(t);
}

// pipeline.layer_masks(s, past): past_mask [1, s, past] hides only the dummy row 0; mask
// [1, s, s] is causal over the new rows (query i sees new rows 0 .. i).
ncnn::Mat past_mask(int s, int past) {
    Tensor m{{1, s, past}, std::vector<float>(static_cast<size_t>(s) * past, 0.0f)};
    for (int q = 0; q < s; ++q) m.data[static_cast<size_t>(q) * past] = kMasked;
    return ncnnport::to_mat(m);
}

ncnn::Mat new_rows_mask(int s) {
    Tensor m{{1, s, s}, std::vector<float>(static_cast<size_t>(s) * s)};
    for (int q = 0; q < s; ++q)
        for (int k = 0; k < s; ++k) m.data[static_cast<size_t>(q) * s + k] = k <= q ? 0.0f : kMasked;
    return ncnnport::to_mat(m);
}

bool has_spec(const std::filesystem::path& package, const std::string& name) {
    return std::filesystem::is_regular_file(package / "specs" / (name + ".spec.json"));
}

// The variant the one-token steps run under fp16 storage (models/youtu_vl/specs.py DECODE).
const char* const kDecodeVariant = "decode";

// Whether specs/NAME.spec.json declares the graph variant `variant` (its "variants" list, the
// one runtime/session.py NcnnModule.variants reads).
bool declares_variant(const std::filesystem::path& package, const std::string& name, const std::string& variant) {
    const auto spec = ncnnport::JsonFile::load(package / "specs" / (name + ".spec.json"));
    if (!spec.has("variants")) return false;
    const nlohmann::json& list = spec.at("variants");
    if (!list.is_array()) spec.fail("variants", "is not a list");
    for (const auto& v : list) {
        if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) spec.fail("variants", "has an entry without a name");
        if (v["name"] == variant) return true;
    }
    return false;
}

}  // namespace

ModelInfo read_model_info(const std::filesystem::path& package) {
    const auto f = ncnnport::JsonFile::load(package / "model.json");
    if (f.string("model") != "youtu-vl") f.fail("model", "is '" + f.string("model") + "', not youtu-vl");
    ModelInfo m;
    m.hidden = as_int(f, "dims.hidden");
    m.layers = as_int(f, "dims.layers");
    m.vocab = as_int(f, "dims.vocab");
    m.kv_lora_rank = as_int(f, "dims.kv_lora_rank");
    m.rope_dim = as_int(f, "dims.qk_rope_head_dim");
    m.max_positions = as_int(f, "max_positions");
    m.image_pad = as_int(f, "special_ids.image_pad");
    for (int64_t id : f.integers("special_ids.eos_ids")) m.eos_ids.push_back(static_cast<int>(id));
    m.default_max_new_tokens = as_int(f, "generation.max_new_tokens");
    m.text_theta = f.number("rope.text_theta");
    m.vision_theta = f.number("rope.vision_theta");
    m.system_prompt = f.string("prompt.system_prompt");
    m.template_text = f.string("prompt.template_text");
    for (const char* piece : {"{system}", "{prompt}"})
        if (m.template_text.find(piece) == std::string::npos) f.fail("prompt.template_text", std::string("has no ") + piece);
    m.tokenizer_file = f.string("files.tokenizer");
    m.vision_layers = as_int(f, "config.vision_config.num_hidden_layers");
    m.vision_heads = as_int(f, "config.vision_config.num_attention_heads");
    m.vision_hidden = as_int(f, "config.vision_config.hidden_size");
    for (int64_t i : f.integers("config.vision_config.fullatt_block_indexes")) m.fullatt_blocks.push_back(static_cast<int>(i));
    auto& p = m.processor;
    p.patch = as_int(f, "preprocessing.patch_size");
    p.merge = as_int(f, "preprocessing.spatial_merge_size");
    p.max_patches = f.integer("preprocessing.max_num_patches");
    p.scale_step = f.number("preprocessing.scale_step");
    const auto mean = f.at("preprocessing.image_mean"), std = f.at("preprocessing.image_std");
    if (!mean.is_array() || mean.size() != 3) f.fail("preprocessing.image_mean", "is not a list of 3 numbers");
    if (!std.is_array() || std.size() != 3) f.fail("preprocessing.image_std", "is not a list of 3 numbers");
    for (int c = 0; c < 3; ++c) {
        if (!mean[c].is_number() || !std[c].is_number()) f.fail("preprocessing.image_mean/std", "holds a non-number");
        p.mean[c] = static_cast<float>(mean[c].get<double>());  // the processor's float32 array
        p.std[c] = static_cast<float>(std[c].get<double>());
    }
    const int window_size = as_int(f, "preprocessing.window_size");
    if (p.patch < 1 || p.merge < 1 || m.vision_heads < 1 || m.vision_hidden % m.vision_heads
        || (m.vision_hidden / m.vision_heads) % 4)
        f.fail("config.vision_config", "has a patch/merge/head layout this runtime cannot take");
    m.window_tokens = window_size / p.merge / p.patch;
    if (m.window_tokens < 1) f.fail("preprocessing.window_size", "is smaller than one merged token");
    return m;
}

std::vector<Segment> vision_segments(const ModelInfo& info) {
    std::vector<bool> windowed;
    for (int i = 0; i < info.vision_layers; ++i)
        windowed.push_back(std::find(info.fullatt_blocks.begin(), info.fullatt_blocks.end(), i) == info.fullatt_blocks.end());
    std::vector<Segment> out;
    for (int i = 0; i < info.vision_layers; ++i)
        if (i == 0 || windowed[i] != windowed[i - 1])
            out.push_back({"vision_seg" + std::to_string(out.size()), windowed[i]});
    return out;
}

Vl::Vl(const std::filesystem::path& package, const ncnnport::GraphOptions& options, Perturb perturb)
    : package_(package), options_(options), perturb_(perturb), info_(read_model_info(package)),
      tokenizer_(ncnnport::BpeTokenizer::from_file((package / info_.tokenizer_file).string())) {
    // pipeline.head_shards: one lm_head graph, or vocab shards lm_head_part0..K in vocab order
    if (has_spec(package, "lm_head")) heads_ = {"lm_head"};
    else
        for (int k = 0; has_spec(package, "lm_head_part" + std::to_string(k)); ++k) heads_.push_back("lm_head_part" + std::to_string(k));
    if (heads_.empty()) throw PackageError((package / "specs" / "lm_head.spec.json").string() + ": missing (no head graph)");
    if (!has_spec(package, "text_embed")) {  // tied embedding: rows of the head's weights
        tied_ = std::make_unique<TiedEmbedding>(package, heads_);
        if (tied_->vocab() != info_.vocab || tied_->width() != info_.hidden)
            throw PackageError((package / "ncnn" / (heads_[0] + ".ncnn.bin")).string() + ": head table is "
                               + std::to_string(tied_->vocab()) + "x" + std::to_string(tied_->width()) + ", model.json dims say "
                               + std::to_string(info_.vocab) + "x" + std::to_string(info_.hidden));
    }
    if (static_cast<int>(tokenizer_.vocab_size()) > info_.vocab)
        throw PackageError((package / info_.tokenizer_file).string() + ": " + std::to_string(tokenizer_.vocab_size())
                           + " ids, more than dims.vocab " + std::to_string(info_.vocab));
    // pipeline.decode_runners: under fp16 storage the one-token steps run the "decode" variants
    // of the layers and heads (InnerProduct over the same .bin: on x86 only InnerProduct reads
    // fp16 weights, pnnx's Gemm keeps them fp32), the prompt the base graphs (Gemm: fast on many
    // rows). As in runtime/variants.with_variant, graphs without the variant stay as they are,
    // and a package where none declares it is an error, not a silent fp32-weight decode.
    std::vector<std::string> text_graphs;  // in the order a token runs them
    for (int i = 0; i < info_.layers; ++i) text_graphs.push_back("llm_layer" + std::to_string(i));
    text_graphs.insert(text_graphs.end(), heads_.begin(), heads_.end());
    if (ncnnport::checked_precision(options_.precision, options_.vulkan).fp16_storage) {
        for (const auto& n : text_graphs)
            if (declares_variant(package, n, kDecodeVariant)) step_variants_.insert(n);
        if (step_variants_.empty())
            throw PackageError((package / "specs" / "llm_layer0.spec.json").string() + ": no layer or head graph declares the '"
                               + kDecodeVariant + "' variant that decode steps under " + options_.precision + " run");
    }
    // The text loop's graphs open here, so a run's load_s holds their loading and prefill_s /
    // decode_s only their runs (opened on first use, the decode variants put their load inside
    // the first step's time: bench-cpp read it as 1.7 s per token instead of 0.1). The vision
    // graphs stay on first use: a text prompt never opens them. Opened in the order a token runs
    // them, so the kernels' weight copies (kernel_weight_allocator.h) lie in that order too.
    for (const auto& n : text_graphs) graph(n);
    for (const auto& n : text_graphs) step_graph(n);
}

ncnnport::Graph& Vl::graph(const std::string& name, const std::string& variant) {
    const std::string key = variant.empty() ? name : name + "." + variant;
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, std::make_unique<ncnnport::Graph>(package_, name, options_, variant)).first;
    return *it->second;
}

std::vector<std::string> Vl::opened_graphs() const {
    std::vector<std::string> names;
    for (const auto& kv : graphs_) names.push_back(kv.first);
    return names;  // std::map: sorted
}

nlohmann::json Vl::call_splits() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& kv : graphs_) {
        const ncnnport::CallSplit& s = kv.second->split();
        if (s.workers > 1)
            out[kv.first] = {{"workers", s.workers}, {"threads_each", s.threads_each},
                             {"split_net", kv.second->loaded()}, {"solo_net", kv.second->solo_open()}};
    }
    return out;
}

ncnnport::Graph& Vl::step_graph(const std::string& name) {
    return graph(name, step_variants_.count(name) ? kDecodeVariant : "");
}

std::vector<float> Vl::encode_image(const ncnnport::youtu::ProcessedImage& image) {
    namespace yp = ncnnport::youtu;
    const int merge = info_.processor.merge, unit = image.merge_unit;
    const yp::WindowLayout layout = yp::window_layout(image.grid_h, image.grid_w, merge, info_.window_tokens);
    const std::vector<int64_t> perm = yp::patch_permutation(layout.index, unit);
    const int n = image.num_patches(), pdim = image.patch_dim;
    if (static_cast<int>(perm.size()) != n) throw GraphError("window layout covers " + std::to_string(perm.size()) + " of " + std::to_string(n) + " patches");
    // pipeline.vision_inputs: pixel rows, 2-D RoPE tables of the patch positions, in window order
    const auto positions = yp::patch_positions(image.grid_h, image.grid_w, merge);
    std::vector<std::array<int, 2>> permuted(n);
    std::vector<float> pv(static_cast<size_t>(n) * pdim);
    for (int i = 0; i < n; ++i) {
        permuted[i] = positions[perm[i]];
        std::memcpy(pv.data() + static_cast<size_t>(i) * pdim, image.pixel_values.data() + perm[i] * pdim, pdim * sizeof(float));
    }
    std::vector<float> cos, sin;
    const int head_dim = info_.vision_hidden / info_.vision_heads;
    yp::axial_cos_sin(permuted, yp::inv_freq(head_dim / 2, info_.vision_theta), cos, sin);

    std::vector<float> h = pv;
    int width = pdim;
    if (has_spec(package_, "vision_tower")) {  // the single-graph split: block-diagonal window mask
        Tensor mask{{1, n, n}, std::vector<float>(static_cast<size_t>(n) * n, kMasked)};
        for (size_t w = 0; w + 1 < layout.cu_seqlens.size(); ++w)
            for (int64_t q = layout.cu_seqlens[w]; q < layout.cu_seqlens[w + 1]; ++q)
                for (int64_t k = layout.cu_seqlens[w]; k < layout.cu_seqlens[w + 1]; ++k) mask.data[q * n + k] = 0.0f;
        const Tensor out = graph("vision_tower").run({rows_mat(h.data(), n, width), rows_mat(cos.data(), n, head_dim),
                                                      rows_mat(sin.data(), n, head_dim), ncnnport::to_mat(mask)})[0];
        h = out.data;
        width = static_cast<int>(out.dim(-1));
    } else {  // pipeline.run_vision_segments: window segments once per window, full ones over all
        for (const Segment& seg : vision_segments(info_)) {
            auto& g = graph(seg.name);
            if (!seg.windowed) {
                const Tensor out = g.run({rows_mat(h.data(), n, width), rows_mat(cos.data(), n, head_dim), rows_mat(sin.data(), n, head_dim)})[0];
                h = out.data;
                width = static_cast<int>(out.dim(-1));
                continue;
            }
            // the windows side by side (the segment's concurrent_calls), outputs in window order
            std::vector<std::vector<ncnn::Mat>> calls;
            for (size_t w = 0; w + 1 < layout.cu_seqlens.size(); ++w) {
                const int a = static_cast<int>(layout.cu_seqlens[w]), rows = static_cast<int>(layout.cu_seqlens[w + 1]) - a;
                calls.push_back({rows_mat(h.data() + static_cast<size_t>(a) * width, rows, width),
                                 rows_mat(cos.data() + static_cast<size_t>(a) * head_dim, rows, head_dim),
                                 rows_mat(sin.data() + static_cast<size_t>(a) * head_dim, rows, head_dim)});
            }
            std::vector<std::vector<float>> parts;
            int out_width = 0;
            for (auto& outs : g.run_each(calls)) {
                out_width = static_cast<int>(outs.at(0).dim(-1));
                parts.push_back(std::move(outs.at(0).data));
            }
            if (perturb_ == Perturb::reverse_windows) std::reverse(parts.begin(), parts.end());
            h.clear();
            for (const auto& part : parts) h.insert(h.end(), part.begin(), part.end());
            width = out_width;
        }
    }
    if (h.size() != static_cast<size_t>(n) * width) throw GraphError("vision tower: output is not [1, patches, hidden]");
    // inverse permutation (raster[perm] = windowed), then the merger over raster-order rows
    std::vector<float> raster(h.size());
    for (int i = 0; i < n; ++i)
        std::memcpy(raster.data() + perm[i] * width, h.data() + static_cast<size_t>(i) * width, width * sizeof(float));
    const Tensor merged = graph("merger").run({rows_mat(raster.data(), n, width)})[0];
    if (merged.dim(-1) != info_.hidden || merged.dim(-2) != image.num_tokens())
        throw GraphError("graph merger: output is not [1, " + std::to_string(image.num_tokens()) + ", " + std::to_string(info_.hidden) + "]");
    return merged.data;
}

std::vector<int> Vl::prompt_ids(const std::string& prompt, std::optional<int> image_tokens) const {
    std::string user;
    if (image_tokens) {  // prompt.chat_text: <|vision_start|> + N x <|image_pad|> + <|vision_end|> before the text
        const auto f = ncnnport::JsonFile::load(package_ / "model.json");
        const std::string start = tokenizer_.decode({static_cast<int>(f.integer("special_ids.vision_start"))}, false);
        const std::string pad = tokenizer_.decode({info_.image_pad}, false);
        const std::string end = tokenizer_.decode({static_cast<int>(f.integer("special_ids.vision_end"))}, false);
        user = start;
        for (int i = 0; i < *image_tokens; ++i) user += pad;
        user += end;
    }
    user += prompt;
    // one pass over the template, so a "{system}" inside the user's text stays text
    const std::string& t = info_.template_text;
    std::string text;
    for (size_t at = 0; at < t.size();) {
        if (t.compare(at, 8, "{system}") == 0) { text += info_.system_prompt; at += 8; }
        else if (t.compare(at, 8, "{prompt}") == 0) { text += user; at += 8; }
        else text += t[at++];
    }
    std::vector<int> ids = tokenizer_.encode(text);
    const auto pads = std::count(ids.begin(), ids.end(), info_.image_pad);
    if (pads != image_tokens.value_or(0))
        throw std::invalid_argument("prompt has " + std::to_string(pads) + " <|image_pad|> tokens, expected "
                                    + std::to_string(image_tokens.value_or(0)));
    return ids;
}

std::vector<float> Vl::embed(const std::vector<int>& ids) {
    if (tied_) return tied_->lookup(ids);
    return graph("text_embed").run({ncnnport::ids_mat(std::vector<int32_t>(ids.begin(), ids.end()))})[0].data;
}

std::vector<float> Vl::head_logits(const std::vector<float>& last_hidden, bool step) {
    const ncnn::Mat input = rows_mat(last_hidden.data(), 1, info_.hidden);
    std::vector<float> logits;
    for (const auto& name : heads_) {
        Tensor part = std::move((step ? step_graph(name) : graph(name)).run({input})[0]);
        if (logits.empty()) logits = std::move(part.data);  // one head: no second copy of V floats
        else logits.insert(logits.end(), part.data.begin(), part.data.end());
    }
    if (logits.size() != static_cast<size_t>(info_.vocab))
        throw GraphError("head graphs gave " + std::to_string(logits.size()) + " logits, dims.vocab is " + std::to_string(info_.vocab));
    return logits;
}

double Vl::decode_graph_seconds() const {
    return ncnnport::graph_seconds_of(graphs_, {"llm_layer", "lm_head", "text_embed"});
}

double Vl::decode_layers_seconds() const { return ncnnport::graph_seconds_of(graphs_, {"llm_layer"}); }

double Vl::vision_graph_seconds() const { return ncnnport::graph_seconds_of(graphs_, {"vision_", "merger"}); }

void Vl::check_positions(int prompt_tokens, int max_new_tokens) const {
    if (prompt_tokens + max_new_tokens > info_.max_positions)
        throw std::invalid_argument("prompt of " + std::to_string(prompt_tokens) + " tokens + " + std::to_string(max_new_tokens)
                                    + " new tokens exceeds the model's max positions (" + std::to_string(info_.max_positions)
                                    + ", config max_position_embeddings)");
}

Generation Vl::generate(const std::vector<int>& ids, const std::vector<float>& visual, int max_new_tokens) {
    const int s = static_cast<int>(ids.size()), h = info_.hidden;
    check_positions(s, max_new_tokens);
    const auto t_prefill = std::chrono::steady_clock::now();
    // prompt.fuse: the rows at <|image_pad|> positions replaced, in order, by the visual tokens
    std::vector<float> x = embed(ids);
    const size_t n_vis = visual.size() / h;
    size_t v = 0;
    for (int i = 0; i < s; ++i)
        if (ids[i] == info_.image_pad) {
            if (v >= n_vis) break;
            std::memcpy(x.data() + static_cast<size_t>(i) * h, visual.data() + v++ * h, h * sizeof(float));
        }
    const auto slots = static_cast<size_t>(std::count(ids.begin(), ids.end(), info_.image_pad));
    if (slots != n_vis) throw GraphError(std::to_string(slots) + " <|image_pad|> positions but " + std::to_string(n_vis) + " visual tokens");

    LatentCache cache(info_.layers, info_.kv_lora_rank, info_.rope_dim, 1 + s + std::max(max_new_tokens, 1));
    const std::vector<float> freqs = ncnnport::youtu::inv_freq(info_.rope_dim, info_.text_theta);
    // pipeline.forward_llm: rows at positions seen .. seen + rows - 1 through every layer
    // (the prompt's rows through the base graphs, a step's one row through step_graph)
    auto forward = [&](const std::vector<float>& embeds, int rows, bool step) {
        std::vector<int64_t> positions(rows);
        // the perturbation: decode steps placed one position too far (the cache length counted
        // with its dummy row); a shift of every position would be invisible (RoPE is relative)
        const int shift = perturb_ == Perturb::rope_shift && cache.seen() > 0 ? 1 : 0;
        for (int i = 0; i < rows; ++i) positions[i] = cache.seen() + i + shift;
        std::vector<float> cos, sin;
        ncnnport::youtu::cos_sin(positions, freqs, cos, sin);
        const ncnn::Mat cos_m = rows_mat(cos.data(), rows, info_.rope_dim), sin_m = rows_mat(sin.data(), rows, info_.rope_dim);
        const ncnn::Mat past_m = past_mask(rows, cache.seen() + 1), mask_m = new_rows_mask(rows);
        Tensor hidden{{1, rows, h}, embeds};
        for (int i = 0; i < info_.layers; ++i) {
            const std::string layer = "llm_layer" + std::to_string(i);
            auto outs = (step ? step_graph(layer) : graph(layer)).run(
                {ncnnport::to_mat(hidden), cos_m, sin_m, past_m, mask_m, cache.past_latent(i), cache.past_krot(i)});
            cache.write(i, outs[1], outs[2]);
            hidden = std::move(outs[0]);
        }
        cache.commit(rows);
        return head_logits(std::vector<float>(hidden.data.end() - h, hidden.data.end()), step);
    };
    std::vector<float> logits = forward(x, s, false);

    Generation gen;
    gen.prompt_tokens = s;
    gen.prefill_s = seconds_since(t_prefill);
    const auto t_decode = std::chrono::steady_clock::now();
    const double graph_before = decode_graph_seconds(), layers_before = decode_layers_seconds();
    const double streams_before = ncnnport::graph_stream_seconds_of(graphs_, {"llm_layer"});
    for (int step = 0; step < max_new_tokens; ++step) {
        const int token = static_cast<int>(ncnnport::greedy(logits));
        gen.tokens.push_back(token);
        if (std::find(info_.eos_ids.begin(), info_.eos_ids.end(), token) != info_.eos_ids.end()) {
            gen.stopped_by_eos = true;
            break;
        }
        if (step == max_new_tokens - 1) break;
        logits = forward(embed({token}), 1, true);
        ++gen.decode_steps;
    }
    gen.decode_s = seconds_since(t_decode);
    gen.decode_graph_s = decode_graph_seconds() - graph_before;
    gen.decode_layers_s = decode_layers_seconds() - layers_before;
    gen.decode_layers_stream_s = ncnnport::graph_stream_seconds_of(graphs_, {"llm_layer"}) - streams_before;
    return gen;
}

}  // namespace youtu_vl
