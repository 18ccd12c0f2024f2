// The Youtu-VL loop over a package's graphs: the C++ twin of models/youtu_vl/packaged.py and
// pipeline.py (vision segments per window, inverse permutation, merger, fusion into the chat
// prompt, prefill and greedy decode over the MLA latent cache).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ncnnport/bpe_tokenizer.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/youtu_processor.h"
#include "tied_embed.h"

namespace youtu_vl {

// What model.json says about the model (every field read, none defaulted).
struct ModelInfo {
    int hidden = 0, layers = 0, vocab = 0, kv_lora_rank = 0, rope_dim = 0, max_positions = 0;
    int image_pad = 0, default_max_new_tokens = 0;
    double text_theta = 0.0, vision_theta = 0.0;
    std::vector<int> eos_ids;
    std::string system_prompt, template_text, tokenizer_file;
    int vision_layers = 0, vision_heads = 0, vision_hidden = 0, window_tokens = 0;
    std::vector<int> fullatt_blocks;
    ncnnport::youtu::ProcessorConfig processor;
};

// Reads PACKAGE/model.json; PackageError naming the field when one is missing or mistyped.
ModelInfo read_model_info(const std::filesystem::path& package);

// Debug switches that break the loop on purpose, so the parity tests can prove they catch it.
// reverse_windows: window outputs concatenated in reverse order; rope_shift: decode steps' RoPE
// position one too far (prefill positions right).
enum class Perturb { none, reverse_windows, rope_shift };

// A maximal run of window-attention or full-attention vision blocks (pipeline.vision_segments).
struct Segment {
    std::string name;
    bool windowed = false;
};
std::vector<Segment> vision_segments(const ModelInfo& info);

struct Generation {
    std::vector<int> tokens;
    bool stopped_by_eos = false;
    int prompt_tokens = 0;
    double vision_s = 0.0, prefill_s = 0.0, decode_s = 0.0;
    int decode_steps = 0;
    double decode_graph_s = 0.0;  // inside ncnn during the decode steps (layers + head)
    // of which the decoder layers' graphs alone: issue 17 item 2's per-layer cost (the head and the
    // embedding read the same bytes at every context length, so the whole step's ratio is flatter)
    double decode_layers_s = 0.0;
    // of which the one-row kernels streaming the layers' weights (the rest: attention over the
    // cache, norms, rope), so a report can say where a longer context's cost went
    double decode_layers_stream_s = 0.0;
};

class Vl {
public:
    Vl(const std::filesystem::path& package, const ncnnport::GraphOptions& options, Perturb perturb);

    // Merged visual tokens [num_tokens, hidden] (row-major) of a processed image.
    std::vector<float> encode_image(const ncnnport::youtu::ProcessedImage& image);
    // The chat prompt's ids (prompt.encode_prompt); checks the image-pad count.
    std::vector<int> prompt_ids(const std::string& prompt, std::optional<int> image_tokens) const;
    // config.check_positions: std::invalid_argument when prompt + new tokens pass max_positions.
    void check_positions(int prompt_tokens, int max_new_tokens) const;
    // Greedy generation stopping at EOS (pipeline.generate with stop_at_eos=True).
    Generation generate(const std::vector<int>& ids, const std::vector<float>& visual, int max_new_tokens);
    std::string decode_text(const std::vector<int>& tokens) const { return tokenizer_.decode(tokens, true); }
    const ModelInfo& info() const { return info_; }
    // Names of the graphs opened so far ("llm_layer0", "llm_layer0.decode", ...), sorted: the JSON's
    // record of which graphs the steps ran.
    std::vector<std::string> opened_graphs() const;
    // How the opened graphs split their threads among concurrent calls ({"NAME": {"workers",
    // "threads_each"}} for graphs that run calls side by side: the window segments).
    nlohmann::json call_splits() const;
    // Seconds inside the vision graphs (segments or tower, merger) so far: encode_image without
    // opening the graphs (vision_s holds both).
    double vision_graph_seconds() const;

private:
    // The graph NAME (or its VARIANT over the same weights), opened on first use.
    ncnnport::Graph& graph(const std::string& name, const std::string& variant = "");
    // The graph a one-token step runs for NAME: its "decode" variant when step_variants_ holds
    // NAME, else NAME itself (pipeline.generate's stepper).
    ncnnport::Graph& step_graph(const std::string& name);
    std::vector<float> embed(const std::vector<int>& ids);
    // Logits [V] of one hidden row through the head graphs (their step variants when `step`).
    std::vector<float> head_logits(const std::vector<float>& last_hidden, bool step);
    double decode_graph_seconds() const;
    double decode_layers_seconds() const;  // the llm_layer graphs' share of decode_graph_seconds

    std::filesystem::path package_;
    ncnnport::GraphOptions options_;
    Perturb perturb_;
    ModelInfo info_;
    ncnnport::BpeTokenizer tokenizer_;
    std::vector<std::string> heads_;
    std::unique_ptr<TiedEmbedding> tied_;  // null when the package has a text_embed graph
    std::map<std::string, std::unique_ptr<ncnnport::Graph>> graphs_;
    // Layers and heads whose one-token steps run their "decode" variant: under fp16 storage
    // (pipeline.decode_runners), every one the package declares it for; empty otherwise.
    std::set<std::string> step_variants_;
};

}  // namespace youtu_vl
