// ncnnport-qwen3-asr: transcribe an audio file with a Qwen3-ASR ncnn package, no Python.
//
//   ncnnport-qwen3-asr --package DIR --audio FILE [--language NAME] [--threads N] [--vulkan]
//                      [--max-new-tokens N] [--max-chunk-seconds S] [--json-out FILE] [--no-check]
//                      [--mel-out FILE] [--ncnn-gemv | --gemv-kernel] [--precision fp32|fp16-storage|bf16] [--huge-pages] [--ncnn-matmul] [--ncnn-int8]
//   ncnnport-qwen3-asr --package DIR --verify [--threads N] [--vulkan] [--ncnn-gemv | --gemv-kernel] [--precision NAME]
//
// The flow of models/qwen3_asr/packaged.py: manifest check, audio -> mono 16 kHz -> official
// cut -> per chunk: log-mel, encoder, prompt ids, greedy decode over the KV cache, official
// parsing; chunks joined. Prints "language: X" and the text; --json-out writes per-chunk token
// ids, language, text and timings (with the precision that ran). --precision: the ncnn flags of
// that runtime/precision.py name on every graph (ncnnport/precision.h; fp16-storage reads the
// InnerProduct weights as fp16, CPU only). Exit 0 ok, 1 a graph failed at run time, 2 bad usage,
// package or audio (one line naming the file). --verify checks the package instead (manifest and
// every graph's golden vectors, ncnnport::run_verify) and exits as `ncnnport-cpp verify` does.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "asr.h"
#include "chunking.h"
#include "ncnnport/audio.h"
#include "ncnnport/cli_args.h"
#include "ncnnport/golden_verify.h"
#include "ncnnport/huge_pages.h"
#include "ncnnport/manifest.h"
#include "ncnnport/precision.h"
#include "ncnnport/sha256.h"

namespace {

constexpr int kMinDecodableSamples = 201;  // audio.MIN_DECODABLE_SAMPLES: more than n_fft / 2

struct Args {
    std::string package, audio, language, json_out;
    std::string mel_out;  // the first chunk's log-mel, raw float32 [n_mels, frames] (tests compare it)
    int threads = 1;
    int max_new_tokens = -1;  // -1: model.json's generation.max_new_tokens
    double max_chunk_seconds = -1;
    bool vulkan = false, check = true, host_kv = false;
    bool verify = false;  // the package's golden vectors instead of a transcription
    ncnnport::GemvChoice gemv = ncnnport::GemvChoice::Auto;  // --ncnn-gemv / --gemv-kernel (ncnn_graph.h)
    std::string precision = "fp32";  // --precision: a CPU precision of ncnnport/precision.h
    bool huge_pages = false;  // --huge-pages: weights collapsed onto 2 MiB pages after loading (huge_pages.h)
    bool matmul_kernel = true;  // --ncnn-matmul: ncnn's MatMul for decode attention (matmul_layer.h)
    bool int8_kernel = true;    // --ncnn-int8: ncnn's Gemm for int8-weights products (int8_gemv_layer.h)
};

using ncnnport::int_arg;
using ncnnport::UsageError;

const char* kUsage =
    "usage: ncnnport-qwen3-asr --package DIR --audio FILE [--language NAME] [--threads N] [--vulkan [--host-kv]]\n"
    "                          [--max-new-tokens N] [--max-chunk-seconds S] [--json-out FILE] [--no-check]\n"
    "                          [--mel-out FILE] [--ncnn-gemv | --gemv-kernel] [--precision fp32|fp16-storage|bf16] [--huge-pages] [--ncnn-matmul] [--ncnn-int8]\n"
    "       ncnnport-qwen3-asr --package DIR --verify [--threads N] [--vulkan] [--ncnn-gemv | --gemv-kernel] [--precision NAME]\n";

// --verify judges the package alone: a transcription option beside it would be silently unused.
void check_verify_args(const Args& a) {
    if (a.package.empty()) throw UsageError("--verify needs --package");
    if (!a.audio.empty() || !a.language.empty() || !a.json_out.empty() || !a.mel_out.empty() || a.max_new_tokens >= 0
        || a.max_chunk_seconds > 0 || !a.check || a.host_kv)
        throw UsageError("--verify takes only --package, --threads, --vulkan, --ncnn-gemv, --gemv-kernel and --precision");
}

Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(flag + " needs a value");
            return argv[++i];
        };
        if (flag == "--package") a.package = value();
        else if (flag == "--audio") a.audio = value();
        else if (flag == "--language") a.language = value();
        else if (flag == "--json-out") a.json_out = value();
        else if (flag == "--mel-out") a.mel_out = value();
        else if (flag == "--threads") a.threads = int_arg(flag, value(), 1);
        else if (flag == "--max-new-tokens") a.max_new_tokens = int_arg(flag, value(), 0);
        else if (flag == "--max-chunk-seconds") {
            const std::string v = value();
            char* end = nullptr;
            a.max_chunk_seconds = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0' || !(a.max_chunk_seconds > 0))
                throw UsageError("--max-chunk-seconds '" + v + "': expected a positive number");
        } else if (flag == "--vulkan") a.vulkan = true;
        else if (flag == "--host-kv") a.host_kv = true;
        else if (flag == "--no-check") a.check = false;
        else if (flag == "--verify") a.verify = true;
        else if (ncnnport::parse_gemv_flag(flag, a.gemv)) {}
        else if (flag == "--huge-pages") a.huge_pages = true;
        else if (flag == "--ncnn-matmul") a.matmul_kernel = false;
        else if (flag == "--ncnn-int8") a.int8_kernel = false;
        else if (flag == "--precision") a.precision = value();
        else throw UsageError("unknown option " + flag);
    }
    if (a.verify) check_verify_args(a);
    else if (a.package.empty() || a.audio.empty()) throw UsageError("--package and --audio are required");
    if (a.host_kv && !a.vulkan) throw UsageError("--host-kv chooses the Vulkan decode's cache: it needs --vulkan");
    ncnnport::checked_precision(a.precision, a.vulkan);  // std::invalid_argument: one line, exit 2
#if !NCNN_VULKAN
    if (a.vulkan) throw UsageError("--vulkan: this build's ncnn has no Vulkan backend (build with make cpp VULKAN=1)");
#endif
    return a;
}

void write_floats(const std::string& path, const std::vector<float>& values) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
    if (!f) throw ncnnport::IoError(path + ": could not write");
}

nlohmann::json ids_json(const std::vector<int>& ids) { return nlohmann::json(ids); }

int run(const Args& args) {
    namespace fs = std::filesystem;
    using clock = std::chrono::steady_clock;
    const auto t_start = clock::now();
    if (!fs::is_directory(args.package)) throw ncnnport::PackageError(args.package + ": not a package folder");
    if (args.check) {
        const auto result = ncnnport::check_package(args.package);
        if (!result.problems.empty())
            throw ncnnport::PackageError(args.package + ": " + result.problems.front()
                                         + (result.problems.size() > 1 ? " (and " + std::to_string(result.problems.size() - 1) + " more)" : ""));
    }
    const auto language = qwen3_asr::normalize_forced_language(args.language);  // before any model work
    std::vector<float> wave = ncnnport::read_audio_16k(args.audio);
    if (wave.size() < kMinDecodableSamples)
        throw ncnnport::AudioError(args.audio + ": audio too short (" + std::to_string(wave.size())
                                   + " samples at 16000 Hz; the official features need at least 201)");

    const ncnnport::GraphOptions graph_options{args.threads, args.vulkan, args.gemv, args.precision, args.huge_pages, args.matmul_kernel,
                                               args.int8_kernel};
    qwen3_asr::Asr asr(args.package, graph_options, !args.host_kv);
    const auto& info = asr.info();
    const int max_new = args.max_new_tokens >= 0 ? args.max_new_tokens : info.default_max_new_tokens;
    const double max_chunk = args.max_chunk_seconds > 0 ? args.max_chunk_seconds : info.max_chunk_seconds;
    const double load_s = std::chrono::duration<double>(clock::now() - t_start).count();

    nlohmann::json chunks = nlohmann::json::array();
    std::vector<qwen3_asr::Parsed> parsed;
    qwen3_asr::Timing timing;
    double decode_s = 0.0;
    int decode_steps = 0;
    for (const auto& chunk : qwen3_asr::split_audio(wave, info.mel.sample_rate, max_chunk)) {
        const ncnnport::LogMel mel = ncnnport::log_mel(chunk.samples, info.mel);
        if (!args.mel_out.empty() && chunks.empty()) write_floats(args.mel_out, mel.features);
        int rows = 0;
        const std::vector<float> embeds = asr.encode(mel, rows);
        const std::vector<int> ids = asr.prompt_ids(qwen3_asr::audio_token_count(mel.valid(), info.mel.n_window), language);
        const qwen3_asr::Generation gen = asr.generate(ids, embeds, rows, max_new, timing);
        const std::string raw = asr.decode_text(gen.tokens);
        parsed.push_back(qwen3_asr::parse_asr_output(raw, language));
        decode_s += gen.decode_s;
        decode_steps += gen.decode_steps;
        chunks.push_back({{"start", chunk.start}, {"end", chunk.end}, {"prompt_tokens", gen.prompt_tokens},
                          {"token_ids", ids_json(gen.tokens)}, {"stopped_by_eos", gen.stopped_by_eos},
                          {"prefill_s", gen.prefill_s}, {"decode_s", gen.decode_s}, {"decode_steps", gen.decode_steps}});
    }
    const qwen3_asr::Parsed joined = qwen3_asr::join_results(parsed);
    std::cout << "language: " << joined.language.value_or("") << "\n" << joined.text << "\n";
    if (!args.json_out.empty()) {
        nlohmann::json out = {
            {"package", args.package}, {"audio", args.audio},
            {"language", joined.language ? nlohmann::json(*joined.language) : nlohmann::json(nullptr)},
            {"text", joined.text}, {"chunks", chunks},
            {"timing", {{"load_s", load_s}, {"total_s", std::chrono::duration<double>(clock::now() - t_start).count()},
                        {"decode_s", decode_s}, {"decode_steps", decode_steps},
                        {"decode_graph_s", timing.decode_graph_s}, {"threads", args.threads},
                        {"backend", args.vulkan ? "vulkan" : "cpu"}, {"kv_cache", asr.kv_on_gpu() ? "gpu" : "host"}}}};
        out["timing"]["graph_s"] = asr.graph_seconds();
        if (timing.decode_layers_s >= 0.0) {
            out["timing"]["decode_layers_s"] = timing.decode_layers_s;
            out["timing"]["decode_layers_stream_s"] = timing.decode_layers_stream_s;
        }
        // the host cache's numbers and the bytes it stores them in (kv_cache.h KvRows)
        out["timing"]["kv_cache_rows"] = ncnnport::kv_rows_label(asr.kv_rows());
        out["timing"]["kv_cache_value_bytes"] = asr.kv_rows() == ncnnport::KvRows::Fp16 ? 2 : 4;
        out["timing"].update(ncnnport::gemv_json(graph_options));
        out["timing"]["huge_pages"] = ncnnport::huge_pages_json(graph_options.huge_pages && !args.vulkan);
        out["timing"].update(ncnnport::precision_record(args.precision));  // the flags the nets carried
        std::ofstream f(args.json_out, std::ios::binary);
        f << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        if (!f) throw ncnnport::IoError(args.json_out + ": could not write");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args args = parse_args(argc, argv);
        if (args.verify) return ncnnport::run_verify(args.package, {args.threads, args.vulkan, args.gemv, args.precision},
                                                      "ncnnport-qwen3-asr: ");
        return run(args);
    } catch (const UsageError& e) {
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n" << kUsage;
        return 2;
    } catch (const ncnnport::PackageError& e) {
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n";
        return 2;
    } catch (const ncnnport::AudioError& e) {
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n";
        return 2;
    } catch (const std::invalid_argument& e) {  // a forced language, an input the model cannot take
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n";
        return 2;
    } catch (const ncnnport::IoError& e) {
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-qwen3-asr: " << e.what() << "\n";
        return 1;
    }
}
