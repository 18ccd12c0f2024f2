// ncnnport-youtu-vl: describe an image (or answer a text prompt) with a Youtu-VL ncnn package,
// no Python.
//
//   ncnnport-youtu-vl --package DIR [--image FILE] --prompt TEXT [--threads N] [--vulkan]
//                     [--max-new-tokens N] [--max-patches N] [--json-out FILE] [--no-check]
//                     [--pixels-out FILE] [--preprocess-only] [--perturb reverse-windows|rope-shift]
//                     [--ncnn-gemv | --gemv-kernel] [--precision fp32|fp16-storage|bf16] [--huge-pages] [--ncnn-matmul] [--ncnn-int8]
//                     [--serial-windows]
//
// The flow of models/youtu_vl/packaged.generate_ids: manifest check, image read upright (EXIF
// orientation) -> processor (size rule, antialiased bilinear, normalisation, patches) -> vision
// segments per window -> merger -> chat prompt with N image pads -> fusion -> prefill -> greedy
// decode over the latent cache until EOS. Prints the text; --json-out writes token ids, text and
// timings (with the precision that ran: --precision sets that runtime/precision.py name's ncnn
// flags on every graph, ncnnport/precision.h; CPU only). Exit 0 ok, 1 a graph failed at run time, 2 bad usage, package or image (one line
// naming the file).
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ncnnport/cli_args.h"
#include "ncnnport/huge_pages.h"
#include "ncnnport/manifest.h"
#include "ncnnport/precision.h"
#include "ncnnport/sha256.h"
#include "ncnnport/youtu_image.h"
#include "vl.h"

namespace {

struct Args {
    std::string package, image, prompt, json_out, pixels_out;
    bool has_prompt = false;
    int threads = 1;
    int max_new_tokens = -1;  // -1: model.json's generation.max_new_tokens
    int64_t max_patches = -1;  // -1: model.json's preprocessing.max_num_patches
    bool vulkan = false, check = true, preprocess_only = false;
    ncnnport::GemvChoice gemv = ncnnport::GemvChoice::Auto;  // --ncnn-gemv / --gemv-kernel (ncnn_graph.h)
    std::string precision = "fp32";  // --precision: a CPU precision of ncnnport/precision.h
    bool huge_pages = false;  // --huge-pages: weights collapsed onto 2 MiB pages after loading (huge_pages.h)
    bool matmul_kernel = true;  // --ncnn-matmul: ncnn's MatMul for decode attention (matmul_layer.h)
    bool int8_kernel = true;    // --ncnn-int8: ncnn's Gemm for int8-weights products (int8_gemv_layer.h)
    bool concurrent_calls = true;  // --serial-windows: one window at a time on all threads (concurrent_calls.h)
    youtu_vl::Perturb perturb = youtu_vl::Perturb::none;
};

using ncnnport::int_arg;
using ncnnport::UsageError;

constexpr int kMinPatches = 4;  // port.MIN_PATCHES: one 2x2 merge block

const char* kUsage =
    "usage: ncnnport-youtu-vl --package DIR [--image FILE] --prompt TEXT [--threads N] [--vulkan]\n"
    "                         [--max-new-tokens N] [--max-patches N] [--json-out FILE] [--no-check]\n"
    "                         [--pixels-out FILE] [--preprocess-only] [--perturb reverse-windows|rope-shift]\n"
    "                         [--ncnn-gemv | --gemv-kernel] [--precision fp32|fp16-storage|bf16] [--huge-pages] [--ncnn-matmul] [--ncnn-int8]\n"
    "                         [--serial-windows]\n";

Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(flag + " needs a value");
            return argv[++i];
        };
        if (flag == "--package") a.package = value();
        else if (flag == "--image") a.image = value();
        else if (flag == "--prompt") { a.prompt = value(); a.has_prompt = true; }
        else if (flag == "--json-out") a.json_out = value();
        else if (flag == "--pixels-out") a.pixels_out = value();
        else if (flag == "--threads") a.threads = int_arg(flag, value(), 1);
        else if (flag == "--max-new-tokens") a.max_new_tokens = int_arg(flag, value(), 1);
        else if (flag == "--max-patches") a.max_patches = int_arg(flag, value(), kMinPatches);
        else if (flag == "--vulkan") a.vulkan = true;
        else if (flag == "--no-check") a.check = false;
        else if (ncnnport::parse_gemv_flag(flag, a.gemv)) {}
        else if (flag == "--huge-pages") a.huge_pages = true;
        else if (flag == "--ncnn-matmul") a.matmul_kernel = false;
        else if (flag == "--ncnn-int8") a.int8_kernel = false;
        else if (flag == "--serial-windows") a.concurrent_calls = false;
        else if (flag == "--precision") a.precision = value();
        else if (flag == "--preprocess-only") a.preprocess_only = true;
        else if (flag == "--perturb") {
            const std::string v = value();
            if (v == "reverse-windows") a.perturb = youtu_vl::Perturb::reverse_windows;
            else if (v == "rope-shift") a.perturb = youtu_vl::Perturb::rope_shift;
            else throw UsageError("--perturb '" + v + "': expected reverse-windows or rope-shift");
        } else throw UsageError("unknown option " + flag);
    }
    if (a.package.empty()) throw UsageError("--package is required");
    if (!a.has_prompt && !a.preprocess_only) throw UsageError("--prompt is required");
    if (a.preprocess_only && a.image.empty()) throw UsageError("--preprocess-only needs --image");
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

void write_json(const std::string& path, const nlohmann::json& out) {
    std::ofstream f(path, std::ios::binary);
    f << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!f) throw ncnnport::IoError(path + ": could not write");
}

void check_package(const std::string& package) {
    const auto result = ncnnport::check_package(package);
    if (!result.problems.empty())
        throw ncnnport::PackageError(package + ": " + result.problems.front()
                                     + (result.problems.size() > 1 ? " (and " + std::to_string(result.problems.size() - 1) + " more)" : ""));
}

// PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS), an error in port.check_image_file.
constexpr int64_t kMaxPixels = 89478485;

// The upright image through the processor; errors name the file.
ncnnport::youtu::ProcessedImage preprocess(const std::string& path, const ncnnport::youtu::ProcessorConfig& config) {
    const ncnnport::RgbImage rgb = ncnnport::youtu::load_upright(path);
    if (static_cast<int64_t>(rgb.width) * rgb.height > kMaxPixels)
        throw ncnnport::ImageError(path + ": refused as a decompression bomb (" + std::to_string(rgb.width) + "x"
                                   + std::to_string(rgb.height) + " pixels, limit " + std::to_string(kMaxPixels) + ")");
    try {
        return ncnnport::youtu::process_image(rgb, config);
    } catch (const ncnnport::youtu::ProcessorError& e) {
        throw ncnnport::ImageError(path + ": " + e.what());
    }
}

int run(const Args& args) {
    namespace fs = std::filesystem;
    using clock = std::chrono::steady_clock;
    const auto t_start = clock::now();
    if (!fs::is_directory(args.package)) throw ncnnport::PackageError(args.package + ": not a package folder");
    if (args.check) check_package(args.package);
    youtu_vl::ModelInfo info = youtu_vl::read_model_info(args.package);
    if (args.max_patches > 0) info.processor.max_patches = args.max_patches;

    // the image first: a bad file is an error before any graph is loaded
    std::optional<ncnnport::youtu::ProcessedImage> image;
    nlohmann::json image_json = nullptr;
    const auto t_pre = clock::now();
    if (!args.image.empty()) {
        image = preprocess(args.image, info.processor);
        image_json = {{"path", args.image}, {"original_hw", {image->original_h, image->original_w}},
                      {"resized_hw", {image->resized_h, image->resized_w}}, {"grid_hw", {image->grid_h, image->grid_w}},
                      {"visual_tokens", image->num_tokens()}};
        if (!args.pixels_out.empty()) write_floats(args.pixels_out, image->pixel_values);
    }
    const double preprocess_s = std::chrono::duration<double>(clock::now() - t_pre).count();
    if (args.preprocess_only) {
        if (!args.json_out.empty()) write_json(args.json_out, {{"runtime", "cpp"}, {"image", image_json}, {"chunks", nlohmann::json::array()}});
        return 0;
    }

    const ncnnport::GraphOptions graph_options{args.threads, args.vulkan, args.gemv, args.precision, args.huge_pages, args.matmul_kernel,
                                               args.int8_kernel, args.concurrent_calls};
    youtu_vl::Vl vl(args.package, graph_options, args.perturb);
    const int max_new = args.max_new_tokens > 0 ? args.max_new_tokens : info.default_max_new_tokens;
    const std::vector<int> ids = vl.prompt_ids(args.prompt, image ? std::optional<int>(image->num_tokens()) : std::nullopt);
    vl.check_positions(static_cast<int>(ids.size()), max_new);  // before the vision tower's work
    const double load_s = std::chrono::duration<double>(clock::now() - t_start).count();
    const auto t_vision = clock::now();
    const std::vector<float> visual = image ? vl.encode_image(*image) : std::vector<float>{};
    const double vision_s = std::chrono::duration<double>(clock::now() - t_vision).count();
    youtu_vl::Generation gen = vl.generate(ids, visual, max_new);
    const std::string text = vl.decode_text(gen.tokens);
    std::cout << text << "\n";
    if (!args.json_out.empty()) {
        const nlohmann::json chunk = {{"prompt_tokens", gen.prompt_tokens}, {"token_ids", gen.tokens},
                                      {"stopped_by_eos", gen.stopped_by_eos}, {"prefill_s", gen.prefill_s},
                                      {"decode_s", gen.decode_s}, {"decode_steps", gen.decode_steps}};
        nlohmann::json out = {{"runtime", "cpp"}, {"model", "youtu-vl"}, {"package", args.package}, {"image", image_json},
                    {"prompt", args.prompt}, {"prompt_ids", ids}, {"text", text}, {"chunks", nlohmann::json::array({chunk})},
                    {"timing", {{"load_s", load_s}, {"preprocess_s", preprocess_s}, {"vision_s", vision_s}, {"vision_graph_s", vl.vision_graph_seconds()},
                                {"prefill_s", gen.prefill_s}, {"decode_s", gen.decode_s}, {"decode_steps", gen.decode_steps},
                                {"decode_graph_s", gen.decode_graph_s}, {"decode_layers_s", gen.decode_layers_s},
                                {"decode_layers_stream_s", gen.decode_layers_stream_s}, {"threads", args.threads}, {"graphs", vl.opened_graphs()},
                                {"total_s", std::chrono::duration<double>(clock::now() - t_start).count()}}}};
        out["timing"].update(ncnnport::gemv_json(graph_options));
        out["timing"]["huge_pages"] = ncnnport::huge_pages_json(graph_options.huge_pages && !args.vulkan);
        out["timing"]["concurrent_calls"] = vl.call_splits();
        out["timing"].update(ncnnport::precision_record(args.precision));  // the flags the nets carried
        write_json(args.json_out, out);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const char* me = "ncnnport-youtu-vl: ";
    try {
        return run(parse_args(argc, argv));
    } catch (const UsageError& e) {
        std::cerr << me << e.what() << "\n" << kUsage;
        return 2;
    } catch (const ncnnport::PackageError& e) {
        std::cerr << me << e.what() << "\n";
        return 2;
    } catch (const ncnnport::ImageError& e) {
        std::cerr << me << e.what() << "\n";
        return 2;
    } catch (const ncnnport::TokenizerError& e) {
        std::cerr << me << e.what() << "\n";
        return 2;
    } catch (const std::invalid_argument& e) {  // an image or prompt the model cannot take
        std::cerr << me << e.what() << "\n";
        return 2;
    } catch (const ncnnport::IoError& e) {
        std::cerr << me << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << me << e.what() << "\n";
        return 1;
    }
}
