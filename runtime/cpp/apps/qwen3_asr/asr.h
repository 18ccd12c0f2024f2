// The Qwen3-ASR loop over a package's graphs: the C++ twin of models/qwen3_asr/packaged.py and
// pipeline.py (encoder windows, prompt, audio fusion, prefill, KV-cached greedy decode).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ncnnport/bpe_tokenizer.h"
#include "ncnnport/gpu_kv_cache.h"
#include "ncnnport/kv_cache.h"
#include "ncnnport/logmel.h"
#include "ncnnport/model_json.h"
#include "ncnnport/ncnn_graph.h"

namespace qwen3_asr {

// What model.json says about the model (every field read, none defaulted).
struct ModelInfo {
    int mel_bins = 0, chunk_frames = 0, hidden = 0, layers = 0, kv_heads = 0, head_dim = 0, audio_layers = 0;
    int max_positions = 0, n_window_infer = 0, audio_token_id = 0, default_max_new_tokens = 0;
    double rope_theta = 0.0, max_chunk_seconds = 0.0;
    std::vector<int> eos_ids;
    std::string prefix_text, suffix_text, audio_token, language_prefill, tokenizer_file;
    std::string precision;  // the package's weights: "fp32", "fp16-weights" or "int8-weights"
    std::vector<int> prefix_ids, suffix_ids;  // the processor's ids of the two pieces, for a check
    ncnnport::LogMelConfig mel;
};

// prompt.audio_token_count: the encoder's row count for `frames` valid mel frames (13 per full
// 2 * n_window chunk, three stride-2 convolutions over the rest); the prompt holds that many
// placeholders and generate() checks the encoder gave exactly that many rows.
int audio_token_count(int frames, int n_window);

// Reads PACKAGE/model.json; PackageError naming the field when one is missing, mistyped, or a
// preprocessing constant differs from what this runtime computes.
ModelInfo read_model_info(const std::filesystem::path& package);

struct Generation {
    std::vector<int> tokens;
    bool stopped_by_eos = false;
    int prompt_tokens = 0;
    double prefill_s = 0.0, decode_s = 0.0;  // wall time of prefill + first logits, and of the decode steps
    int decode_steps = 0;
};

// Timing of graph work inside the decode steps (embed + decode layers + head), for the overhead number.
struct Timing {
    double decode_graph_s = 0.0;  // on the GPU path: recording + waiting for the device
    // of which the decode_layer graphs alone on the host path (the per-layer cost that flatness in
    // context is about: the embedding and the head read the same bytes at every context length);
    // negative once a step ran on the GPU, whose one command holds every graph
    double decode_layers_s = 0.0;
    // of which the one-row kernels streaming the layers' weights (host path only)
    double decode_layers_stream_s = 0.0;
};

class Asr {
public:
    // kv_on_gpu (Vulkan only): decode with the cache on the device (gpu_kv_cache.h), every decode
    // layer and the head recorded into one command per token; false keeps the host cache.
    Asr(const std::filesystem::path& package, const ncnnport::GraphOptions& options, bool kv_on_gpu = true);

    // Audio embeddings [N, audio_out] (row-major) of one chunk's features.
    std::vector<float> encode(const ncnnport::LogMel& mel, int& rows);
    // prefix + n x audio placeholder + suffix (+ forced-language prefill), tokenized whole.
    std::vector<int> prompt_ids(int n_audio, const std::optional<std::string>& language) const;
    // Greedy decode over the KV cache, exactly as Qwen3ASRPipeline.generate (no min length).
    Generation generate(const std::vector<int>& ids, const std::vector<float>& audio_embeds, int audio_rows,
                        int max_new_tokens, Timing& timing);
    std::string decode_text(const std::vector<int>& tokens) const { return tokenizer_.decode(tokens, true); }
    const ModelInfo& info() const { return info_; }
    bool kv_on_gpu() const { return kv_on_gpu_; }
    // The host cache's rows (kv_cache.h): fp16 under ncnnport::fp16_kv_rows, stored in 2 bytes
    // where the decode MatMul overwrite reads them (matmul_fp16_cache_supported), else as floats.
    ncnnport::KvRows kv_rows() const { return kv_rows_; }
    // Seconds spent in each opened graph so far (prefill, decode and head apart), so a token's
    // cost can be split between the layers, the head and the host work around them.
    std::map<std::string, double> graph_seconds() const;

private:
    ncnnport::Graph& graph(const std::string& name);
    // The head's logits row for one hidden state, as ncnn returned it (one contiguous float32 row,
    // Graph::run_mats: the host only scans it, so it is not copied).
    ncnn::Mat logits(const std::vector<float>& hidden);
    std::vector<float> embed_token(int token);
    void rope_tables(int start, int length, std::vector<float>& cos, std::vector<float>& sin) const;
    // One decode step at position cache.length() for `token`: the next logits row.
    ncnn::Mat host_step(int token, ncnnport::KvCache& cache);
#if NCNN_VULKAN
    ncnn::Mat gpu_step(int token, ncnnport::GpuKvCache& cache, double& wait_s);
#endif

    std::filesystem::path package_;
    ModelInfo info_;
    ncnnport::BpeTokenizer tokenizer_;
    std::map<std::string, std::unique_ptr<ncnnport::Graph>> graphs_;
    std::vector<float> inv_freq_;
    bool kv_on_gpu_ = false;
    ncnnport::KvRows kv_rows_ = ncnnport::KvRows::Fp32;
#if NCNN_VULKAN
    std::unique_ptr<ncnnport::GpuArena> arena_;  // the recorded decode steps' device memory
#endif
};

}  // namespace qwen3_asr
