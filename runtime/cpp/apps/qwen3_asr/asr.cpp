#include "asr.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <stdexcept>

#include "ncnnport/greedy.h"
#include "ncnnport/kv_cache.h"
#include "ncnnport/precision.h"

namespace qwen3_asr {

using ncnnport::GraphError;
using ncnnport::PackageError;
using ncnnport::Tensor;

namespace {

constexpr float kMasked = -1e30f;  // runtime/masks.MASKED

// The graphs a decode step runs (the embedding row, every decode layer, the head): not the audio
// encoder's, not the prompt's prefill layers.
const std::vector<std::string> kDecodeGraphs{"embed", "decode_layer", "lm_head"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int post_conv_length(int frames) {
    for (int i = 0; i < 3; ++i) frames = frames > 0 ? (frames - 1) / 2 + 1 : 0;
    return frames;
}

int positive(const ncnnport::JsonFile& f, const std::string& field) {
    const int64_t v = f.integer(field);
    if (v <= 0 || v > INT32_MAX) f.fail(field, "must be a positive 32-bit integer");
    return static_cast<int>(v);
}

}  // namespace

int audio_token_count(int frames, int n_window) {
    const int chunk = 2 * n_window;
    return frames / chunk * 13 + (frames % chunk ? post_conv_length(frames % chunk) : 0);
}

ModelInfo read_model_info(const std::filesystem::path& package) {
    const auto f = ncnnport::JsonFile::load(package / "model.json");
    if (f.string("model") != "qwen3-asr") f.fail("model", "is '" + f.string("model") + "', not qwen3-asr");
    ModelInfo m;
    m.mel_bins = positive(f, "dims.mel_bins");
    m.chunk_frames = positive(f, "dims.chunk_frames");
    m.hidden = positive(f, "dims.hidden");
    m.layers = positive(f, "dims.layers");
    m.kv_heads = positive(f, "dims.kv_heads");
    m.head_dim = positive(f, "dims.head_dim");
    m.audio_layers = positive(f, "dims.audio_layers");
    m.max_positions = positive(f, "dims.max_positions");
    m.rope_theta = f.number("dims.rope_theta");
    m.n_window_infer = positive(f, "audio.n_window_infer");
    m.audio_token_id = positive(f, "special_ids.audio_token_id");
    for (int64_t e : f.integers("special_ids.eos_ids")) m.eos_ids.push_back(static_cast<int>(e));
    m.prefix_text = f.string("prompt.prefix_text");
    m.suffix_text = f.string("prompt.suffix_text");
    m.audio_token = f.string("prompt.audio_token");
    m.language_prefill = f.string("prompt.language_prefill");
    for (int64_t id : f.integers("prompt.prefix_ids")) m.prefix_ids.push_back(static_cast<int>(id));
    for (int64_t id : f.integers("prompt.suffix_ids")) m.suffix_ids.push_back(static_cast<int>(id));
    m.default_max_new_tokens = positive(f, "generation.max_new_tokens");
    m.max_chunk_seconds = f.number("generation.max_chunk_seconds");
    m.tokenizer_file = f.string("files.tokenizer");
    m.precision = f.has("precision") ? f.string("precision") : "fp32";  // package/model_json.py DEFAULT_PRECISION
    if (m.head_dim % 2) f.fail("dims.head_dim", "must be even (rotate-half RoPE)");
    // The package's log-mel constants must be the ones logmel.cpp computes with (packaged.check_preprocessing).
    const ncnnport::LogMelConfig ours;
    const std::pair<const char*, double> expect[] = {
        {"preprocessing.sample_rate", ours.sample_rate}, {"preprocessing.n_fft", ours.n_fft},
        {"preprocessing.hop_length", ours.hop}, {"preprocessing.n_mels", ours.n_mels},
        {"preprocessing.n_window", ours.n_window}, {"preprocessing.log_floor_db", ours.log_floor}};
    for (const auto& [field, value] : expect)
        if (f.number(field) != value)
            f.fail(field, "is " + f.at(field).dump() + "; this runtime computes log-mel with " + std::to_string(value));
    m.mel = ours;
    if (m.mel_bins != ours.n_mels) f.fail("dims.mel_bins", "differs from preprocessing.n_mels");
    if (m.chunk_frames != 2 * ours.n_window) f.fail("dims.chunk_frames", "is not 2 * preprocessing.n_window");
    if (m.n_window_infer % m.chunk_frames) f.fail("audio.n_window_infer", "is not a multiple of dims.chunk_frames");
    return m;
}

Asr::Asr(const std::filesystem::path& package, const ncnnport::GraphOptions& options, bool kv_on_gpu)
    : package_(package),
      info_(read_model_info(package)),
      tokenizer_([&] {
          try {
              return ncnnport::BpeTokenizer::from_file((package / info_.tokenizer_file).string());
          } catch (const ncnnport::TokenizerError& e) {
              throw PackageError(e.what());
          }
      }()) {
    std::vector<std::string> names{"audio_conv", "audio_head", "embed", "lm_head"};
    for (int i = 0; i < info_.audio_layers; ++i) names.push_back("audio_layer" + std::to_string(i));
    for (int i = 0; i < info_.layers; ++i) {
        names.push_back("prefill_layer" + std::to_string(i));
        names.push_back("decode_layer" + std::to_string(i));
    }
    // The processor's own ids of the template pieces must be what this tokenizer gives them (a
    // post-processor that adds tokens, or a tokenizer this class reads differently, fails here).
    if (tokenizer_.encode(info_.prefix_text) != info_.prefix_ids || tokenizer_.encode(info_.suffix_text) != info_.suffix_ids)
        throw PackageError((package / "model.json").string() + ": field 'prompt.prefix_ids'/'prompt.suffix_ids' differ from "
                           + info_.tokenizer_file + "'s encoding of the prompt pieces");
    for (const auto& n : names) graphs_[n] = std::make_unique<ncnnport::Graph>(package, n, options);
    // The GPU-resident decode records the decode layers' "gpu" variant (attention as Vulkan
    // layers); a package converted before that variant existed decodes over the host cache.
    kv_on_gpu_ = options.vulkan && kv_on_gpu
                 && std::filesystem::is_regular_file(package / "ncnn" / "decode_layer0.gpu.ncnn.param");
    if (options.vulkan && kv_on_gpu && !kv_on_gpu_)
        std::cerr << "ncnnport-qwen3-asr: the package has no gpu decode variant (decode_layer0.gpu.ncnn.param): "
                     "the KV cache stays on the host\n";
    if (ncnnport::fp16_kv_rows(ncnnport::checked_precision(options.precision, options.vulkan), info_.precision, options.vulkan))
        kv_rows_ = ncnnport::fp16_cache_inputs_active(options) ? ncnnport::KvRows::Fp16 : ncnnport::KvRows::Fp16Values;
    for (int i = 0; kv_on_gpu_ && i < info_.layers; ++i) {
        const std::string n = "decode_layer" + std::to_string(i);
        graphs_[n + ".gpu"] = std::make_unique<ncnnport::Graph>(package, n, options, "gpu");
    }
    // rope.inv_freq: exponent = float32(2i) / d in float32, 1 / theta^exponent in float32 (powf)
    for (int i = 0; i < info_.head_dim; i += 2) {
        const float exponent = static_cast<float>(i) / static_cast<float>(info_.head_dim);
        inv_freq_.push_back(1.0f / std::pow(static_cast<float>(info_.rope_theta), exponent));
    }
}

ncnnport::Graph& Asr::graph(const std::string& name) { return *graphs_.at(name); }

std::vector<float> Asr::encode(const ncnnport::LogMel& mel, int& rows) {
    // pipeline.conv_features: one conv call per 100-frame chunk with valid frames, keep post-conv rows
    const int chunk = info_.chunk_frames;
    if (mel.frames % chunk) throw GraphError("mel frames not a multiple of the chunk");
    std::vector<float> conv;
    std::vector<int> lengths;
    int width = 0;
    for (int c = 0; c < mel.frames / chunk; ++c) {
        int valid = 0;
        for (int f = c * chunk; f < (c + 1) * chunk; ++f) valid += mel.mask[f];
        if (valid == 0) continue;
        Tensor in{{1, 1, mel.n_mels, chunk}, std::vector<float>(static_cast<size_t>(mel.n_mels) * chunk)};
        for (int m = 0; m < mel.n_mels; ++m)
            std::copy_n(mel.features.begin() + static_cast<size_t>(m) * mel.frames + c * chunk, chunk,
                        in.data.begin() + static_cast<size_t>(m) * chunk);
        const Tensor out = graph("audio_conv").run({ncnnport::to_mat(in)})[0];
        width = static_cast<int>(out.dim(-1));
        const int keep = post_conv_length(valid);
        if (keep > out.dim(1)) throw GraphError("graph audio_conv: fewer rows than the valid frames need");
        conv.insert(conv.end(), out.data.begin(), out.data.begin() + static_cast<size_t>(keep) * width);
        lengths.push_back(keep);
    }
    if (lengths.empty()) throw std::invalid_argument("audio has no valid mel frames");
    // pipeline.encode: windows of max(lengths) * (n_window_infer / chunk_frames) rows, full attention inside
    const int total = static_cast<int>(conv.size() / width);
    const int window = *std::max_element(lengths.begin(), lengths.end()) * (info_.n_window_infer / chunk);
    std::vector<float> embeds;
    int out_width = 0;
    for (int start = 0; start < total; start += window) {
        const int n = std::min(window, total - start);
        Tensor x{{1, n, width}, std::vector<float>(conv.begin() + static_cast<size_t>(start) * width,
                                                   conv.begin() + static_cast<size_t>(start + n) * width)};
        for (int i = 0; i < info_.audio_layers; ++i) x = graph("audio_layer" + std::to_string(i)).run({ncnnport::to_mat(x)})[0];
        const Tensor emb = graph("audio_head").run({ncnnport::to_mat(x)})[0];
        out_width = static_cast<int>(emb.dim(-1));
        embeds.insert(embeds.end(), emb.data.begin(), emb.data.end());
    }
    rows = static_cast<int>(embeds.size() / out_width);
    return embeds;
}

std::vector<int> Asr::prompt_ids(int n_audio, const std::optional<std::string>& language) const {
    std::string text = info_.prefix_text;
    for (int i = 0; i < n_audio; ++i) text += info_.audio_token;
    text += info_.suffix_text;
    if (language) {
        std::string prefill = info_.language_prefill;
        const size_t at = prefill.find("{language}");
        if (at != std::string::npos) prefill.replace(at, 10, *language);
        text += prefill;
    }
    return tokenizer_.encode(text);
}

void Asr::rope_tables(int start, int length, std::vector<float>& cos, std::vector<float>& sin) const {
    // rope.cos_sin: angle = float32(position) * inv_freq in float32, tables cat(angles, angles)
    const int half = static_cast<int>(inv_freq_.size());
    cos.resize(static_cast<size_t>(length) * 2 * half);
    sin.resize(cos.size());
    for (int p = 0; p < length; ++p)
        for (int i = 0; i < half; ++i) {
            const float angle = static_cast<float>(start + p) * inv_freq_[i];
            const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
            const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
            for (int r : {i, i + half}) {
                cos[static_cast<size_t>(p) * 2 * half + r] = c;
                sin[static_cast<size_t>(p) * 2 * half + r] = s;
            }
        }
}

ncnn::Mat Asr::logits(const std::vector<float>& hidden) {
    ncnn::Mat row = graph("lm_head").run_mats({ncnnport::to_mat(Tensor{{1, static_cast<int64_t>(hidden.size())}, hidden})})[0];
    if (row.c != 1) throw GraphError("graph lm_head: logits in " + std::to_string(row.c) + " channels, want one row");
    return row;
}

std::map<std::string, double> Asr::graph_seconds() const {
    std::map<std::string, double> out;
    for (const auto& [name, g] : graphs_) out[name] = g->seconds();
    return out;
}

std::vector<float> Asr::embed_token(int token) {
    return graph("embed").run({ncnnport::ids_mat({token})})[0].data;
}

Generation Asr::generate(const std::vector<int>& ids, const std::vector<float>& audio_embeds, int audio_rows,
                         int max_new_tokens, Timing& timing) {
    const auto t_prefill = std::chrono::steady_clock::now();
    // pipeline.embed_prompt: embed every id, audio placeholders replaced by the encoder rows in order
    Tensor emb = graph("embed").run({ncnnport::ids_mat(std::vector<int32_t>(ids.begin(), ids.end()))})[0];
    const int s = static_cast<int>(ids.size());
    const int h = info_.hidden;
    if (emb.data.size() != static_cast<size_t>(s) * h) throw GraphError("graph embed: output is not [1, seq, hidden]");
    const int slots = static_cast<int>(std::count(ids.begin(), ids.end(), info_.audio_token_id));
    if (slots != audio_rows)
        throw GraphError("prompt has " + std::to_string(slots) + " audio placeholders but the encoder gave "
                         + std::to_string(audio_rows) + " embeddings");
    if (audio_rows && audio_embeds.size() / audio_rows != static_cast<size_t>(h))
        throw GraphError("audio embeddings are not hidden-wide");
    for (int i = 0, a = 0; i < s; ++i)
        if (ids[i] == info_.audio_token_id)
            std::copy_n(audio_embeds.begin() + static_cast<size_t>(a++) * h, h, emb.data.begin() + static_cast<size_t>(i) * h);
    if (s + max_new_tokens > info_.max_positions)
        throw std::invalid_argument("prompt of " + std::to_string(s) + " tokens + " + std::to_string(max_new_tokens)
                                    + " new tokens exceeds the model's max positions (" + std::to_string(info_.max_positions) + ")");
    ncnnport::KvCache cache(info_.layers, info_.kv_heads, info_.head_dim, s + std::max(max_new_tokens, 1), kv_rows_);

    // prefill: RoPE for 0..s-1, causal mask, every layer's K/V into the cache
    std::vector<float> cos, sin;
    rope_tables(0, s, cos, sin);
    Tensor mask{{1, s, s}, std::vector<float>(static_cast<size_t>(s) * s)};
    for (int q = 0; q < s; ++q)
        for (int k = 0; k < s; ++k) mask.data[static_cast<size_t>(q) * s + k] = k <= q ? 0.0f : kMasked;
    const int d = info_.head_dim;
    const ncnn::Mat cos_m = ncnnport::to_mat(Tensor{{1, s, d}, cos}), sin_m = ncnnport::to_mat(Tensor{{1, s, d}, sin});
    const ncnn::Mat mask_m = ncnnport::to_mat(mask);
    Tensor hidden = emb;
    for (int i = 0; i < info_.layers; ++i) {
        auto outs = graph("prefill_layer" + std::to_string(i)).run({ncnnport::to_mat(hidden), cos_m, sin_m, mask_m});
        cache.write(i, outs[1], outs[2]);
        hidden = std::move(outs[0]);
    }
    cache.commit(s);
    std::vector<float> last(hidden.data.end() - h, hidden.data.end());
    ncnn::Mat row = logits(last);

    Generation gen;
    gen.prompt_tokens = s;
    gen.prefill_s = seconds_since(t_prefill);
    const auto t_decode = std::chrono::steady_clock::now();
    const double graph_before = ncnnport::graph_seconds_of(graphs_, kDecodeGraphs);
    const double layers_before = ncnnport::graph_seconds_of(graphs_, {"decode_layer"});
    const double streams_before = ncnnport::graph_stream_seconds_of(graphs_, {"decode_layer"});
#if NCNN_VULKAN
    std::unique_ptr<ncnnport::GpuKvCache> on_gpu;
    double wait_s = 0.0;
    if (kv_on_gpu_ && max_new_tokens > 1) {
        // the prompt's cache goes to the device once; from here it never returns to the host
        const ncnn::VulkanDevice* vkdev = graph("decode_layer0").vulkan_device();
        ncnn::VkCompute cmd(vkdev);
        on_gpu = std::make_unique<ncnnport::GpuKvCache>(vkdev, cache, cmd);
        if (!arena_) arena_ = std::make_unique<ncnnport::GpuArena>(vkdev);
        if (cmd.submit_and_wait() != 0) throw GraphError("gpu kv cache: the prompt's upload failed on the device");
    }
#endif
    for (int step = 0; step < max_new_tokens; ++step) {
        // one channel (logits() checks it): w * h * d floats, no channel padding
        const int token = static_cast<int>(ncnnport::greedy(static_cast<const float*>(row.data),
                                                            static_cast<size_t>(row.w) * row.h * row.d));
        gen.tokens.push_back(token);
        if (std::find(info_.eos_ids.begin(), info_.eos_ids.end(), token) != info_.eos_ids.end()) {
            gen.stopped_by_eos = true;
            break;
        }
        if (step == max_new_tokens - 1) break;
#if NCNN_VULKAN
        if (on_gpu) row = gpu_step(token, *on_gpu, wait_s);
        else
#endif
            row = host_step(token, cache);
        ++gen.decode_steps;
    }
#if NCNN_VULKAN
    timing.decode_graph_s += wait_s;
#endif
    gen.decode_s = seconds_since(t_decode);
    timing.decode_graph_s += ncnnport::graph_seconds_of(graphs_, kDecodeGraphs) - graph_before;
#if NCNN_VULKAN
    if (on_gpu) timing.decode_layers_s = -1.0;
#endif
    if (timing.decode_layers_s >= 0.0) {
        timing.decode_layers_s += ncnnport::graph_seconds_of(graphs_, {"decode_layer"}) - layers_before;
        timing.decode_layers_stream_s += ncnnport::graph_stream_seconds_of(graphs_, {"decode_layer"}) - streams_before;
    }
    return gen;
}

ncnn::Mat Asr::host_step(int token, ncnnport::KvCache& cache) {
    // decode_step at position cache.length: every decode layer reads the past in place
    const int d = info_.head_dim;
    std::vector<float> tc, ts;
    rope_tables(cache.length(), 1, tc, ts);
    const ncnn::Mat tc_m = ncnnport::to_mat(Tensor{{1, 1, d}, tc}), ts_m = ncnnport::to_mat(Tensor{{1, 1, d}, ts});
    Tensor x{{1, info_.hidden}, embed_token(token)};
    for (int i = 0; i < info_.layers; ++i) {
        auto outs = graph("decode_layer" + std::to_string(i)).run(
            {ncnnport::to_mat(x), tc_m, ts_m, cache.past_k(i), cache.past_v(i)});
        cache.write(i, outs[1], outs[2]);
        x = std::move(outs[0]);
    }
    cache.commit(1);
    return logits(x.data);
}

#if NCNN_VULKAN
ncnn::Mat Asr::gpu_step(int token, ncnnport::GpuKvCache& cache, double& wait_s) {
    // the same step with every decode layer and the head recorded into one command: the hidden
    // state and the K/V rows stay on the device, only the logits row comes back
    using ncnnport::GpuInput;
    const int d = info_.head_dim;
    std::vector<float> tc, ts;
    rope_tables(cache.length(), 1, tc, ts);
    const ncnn::Mat tc_m = ncnnport::to_mat(Tensor{{1, 1, d}, tc}), ts_m = ncnnport::to_mat(Tensor{{1, 1, d}, ts});
    const ncnn::Mat x0 = ncnnport::to_mat(Tensor{{1, info_.hidden}, embed_token(token)});
    ncnnport::Graph& head = graph("lm_head");
    ncnn::VkCompute cmd(head.vulkan_device());
    GpuInput x = GpuInput::on_host(x0);
    std::vector<ncnn::VkMat> hidden;  // each layer's output, alive until the command ran
    for (int i = 0; i < info_.layers; ++i) {
        auto outs = graph("decode_layer" + std::to_string(i) + ".gpu").record(
            cmd, {x, GpuInput::on_host(tc_m), GpuInput::on_host(ts_m), GpuInput::on_gpu(cache.past_k(i)),
                  GpuInput::on_gpu(cache.past_v(i))}, *arena_);
        cache.record_append(cmd, i, outs[1], outs[2]);
        hidden.push_back(outs[0]);
        x = GpuInput::on_gpu(outs[0]);
    }
    const ncnn::VkMat logits_gpu = head.record(cmd, {x}, *arena_)[0];
    ncnn::Mat logits_host;
    cmd.record_download(logits_gpu, logits_host, arena_->options());
    const auto t0 = std::chrono::steady_clock::now();
    if (cmd.submit_and_wait() != 0) throw GraphError("decode step: the device command failed");
    wait_s += seconds_since(t0);
    // The host cache refuses a non-finite K/V row as it is written; these rows never reach the
    // host, so a NaN or Inf from the device graphs is caught where it lands: the logits.
    std::vector<float> row = head.host_output(0, logits_host).data;
    for (float v : row)
        if (!std::isfinite(v))
            throw GraphError("decode step at position " + std::to_string(cache.length())
                             + ": non-finite logits from the GPU-resident decode (K/V rows stay on the device)");
    cache.commit(1);
    ncnn::Mat out(static_cast<int>(row.size()));
    std::copy(row.begin(), row.end(), static_cast<float*>(out.data));
    return out;
}
#endif

}  // namespace qwen3_asr
