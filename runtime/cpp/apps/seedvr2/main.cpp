// ncnnport-seedvr2: one-step SeedVR2 restoration from a standalone package, in C++.
//
//   ncnnport-seedvr2 --package DIR --input IMAGE|FRAME_DIR --output DIR --noise NOISE.npz
//                    [--area PIXELS] [--threads N] [--vulkan] [--no-colour-fix] [--no-check]
//                    [--json-out FILE] [--precision fp32|fp16-storage|bf16]
//   ncnnport-seedvr2 --package DIR --verify [--threads N] [--vulkan] [--precision NAME]
//
// Writes DIR/frame_00000.png ... (DIR new or empty). Exit codes: 0 ok, 1 a failure while running
// (an ncnn call, a write), 2 bad arguments, package or input (one line naming the file).
// --verify checks the package instead (manifest and every graph's golden vectors,
// ncnnport::run_verify) and exits as `ncnnport-cpp verify` does: 0 pass, 1 a failed row, 2 unjudgeable.
// --precision: that runtime/precision.py name's ncnn flags on every graph (ncnnport/precision.h;
// CPU only), recorded in --json-out.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "ncnnport/golden_verify.h"
#include "ncnnport/image_io.h"
#include "ncnnport/manifest.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/precision.h"
#include "ncnnport/seedvr2_npy.h"
#include "ncnnport/seedvr2_pipeline.h"
#include "ncnnport/sha256.h"

namespace fs = std::filesystem;
using ncnnport::seedvr2::Frames;

namespace {

// Bad arguments, package or input: one line, exit 2.
struct InputError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Args {
    fs::path package, input, output, noise, json_out, dump_dir;
    int64_t area = 0;
    int threads = 1;
    bool vulkan = false, colour_fix = true, check = true;
    bool verify = false;  // the package's golden vectors instead of a restoration
    std::string precision = "fp32";  // --precision: a CPU precision of ncnnport/precision.h
    ncnnport::seedvr2::Perturb perturb;
};

const char* kUsage =
    "usage: ncnnport-seedvr2 --package DIR --input IMAGE|FRAME_DIR --output DIR --noise NOISE.npz\n"
    "                        [--area PIXELS] [--threads N] [--vulkan] [--no-colour-fix] [--no-check]\n"
    "                        [--json-out FILE] [--dump-stages DIR] [--precision fp32|fp16-storage|bf16]\n"
    "       ncnnport-seedvr2 --package DIR --verify [--threads N] [--vulkan] [--precision NAME]\n";

int64_t positive(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used == v.size() && n > 0) return n;
    } catch (const std::exception&) {
    }
    throw InputError(flag + ": '" + v + "' is not a positive integer");
}

// --verify judges the package alone: a restoration option beside it would be silently unused.
void check_verify_args(const Args& a) {
    if (a.package.empty()) throw InputError("--verify needs --package\n" + std::string(kUsage));
    if (!a.input.empty() || !a.output.empty() || !a.noise.empty() || !a.json_out.empty() || !a.dump_dir.empty() || a.area
        || !a.colour_fix || !a.check || a.perturb.swap_shift || a.perturb.flip_rope_h_w)
        throw InputError("--verify takes only --package, --threads, --vulkan and --precision");
}

Args parse(int argc, char** argv) {
    Args a;
    std::map<std::string, fs::path*> paths{{"--package", &a.package}, {"--input", &a.input}, {"--output", &a.output},
                                           {"--noise", &a.noise}, {"--json-out", &a.json_out},
                                           {"--dump-stages", &a.dump_dir}};
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw InputError(f + ": needs a value");
            return argv[++i];
        };
        if (paths.count(f)) *paths[f] = value();
        else if (f == "--area") a.area = positive(f, value());
        else if (f == "--threads") a.threads = static_cast<int>(positive(f, value()));
        else if (f == "--vulkan") a.vulkan = true;
        else if (f == "--no-colour-fix") a.colour_fix = false;
        else if (f == "--no-check") a.check = false;
        else if (f == "--verify") a.verify = true;
        else if (f == "--precision") a.precision = value();
        // test-only perturbations (tests/cpp/test_seedvr2_cpp.py proves they break parity)
        else if (f == "--perturb" ) {
            const std::string p = value();
            if (p == "swap-shift") a.perturb.swap_shift = true;
            else if (p == "flip-rope") a.perturb.flip_rope_h_w = true;
            else throw InputError("--perturb: unknown '" + p + "'");
        } else throw InputError("unknown argument '" + f + "'\n" + kUsage);
    }
    try {
        ncnnport::checked_precision(a.precision, a.vulkan);
    } catch (const std::invalid_argument& e) {
        throw InputError(e.what());
    }
    if (a.verify) {
        check_verify_args(a);
        return a;
    }
    for (const auto& [flag, p] : paths)
        if (flag != "--json-out" && flag != "--dump-stages" && p->empty()) throw InputError(flag + " is required\n" + kUsage);
    return a;
}

// The image files an --input names: the file, or a folder's .png/.jpg/.jpeg in name order.
std::vector<fs::path> input_files(const fs::path& in) {
    std::error_code ec;
    if (!fs::exists(in, ec)) throw InputError(in.string() + ": no such file or folder");
    if (!fs::is_directory(in, ec)) {
        if (!ncnnport::is_image_suffix(in)) throw InputError(in.string() + ": not a PNG or JPEG image (.png, .jpg, .jpeg)");
        return {in};
    }
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(in))
        if (e.is_regular_file() && ncnnport::is_image_suffix(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw InputError(in.string() + ": folder holds no images (.png, .jpg, .jpeg)");
    return files;
}

Frames read_frames(const fs::path& in) {
    Frames f;
    for (const fs::path& p : input_files(in)) {
        ncnnport::RgbImage img;
        try {
            img = ncnnport::read_image(p);
        } catch (const ncnnport::ImageError& e) {
            throw InputError(e.what());
        }
        if (f.t == 0) f.h = img.height, f.w = img.width;
        if (img.height != f.h || img.width != f.w)
            throw InputError(p.string() + ": frame is " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                             ", earlier frames are " + std::to_string(f.w) + "x" + std::to_string(f.h));
        f.rgb.insert(f.rgb.end(), img.rgb.begin(), img.rgb.end());
        ++f.t;
    }
    return f;
}

// The run verb's output rule (models/seedvr2/port.py check_output), for a frames folder.
void check_output(const fs::path& in, const fs::path& out) {
    std::error_code ec;
    const fs::path ri = fs::weakly_canonical(in, ec), ro = fs::weakly_canonical(out, ec);
    if (ri == ro) throw InputError("--output " + out.string() + " is the --input itself; choose another path");
    for (fs::path p = ro; p.has_relative_path() && p != p.parent_path(); p = p.parent_path())
        if (p.parent_path() == ri) throw InputError("--output " + out.string() + " is inside --input " + in.string());
    if (fs::exists(out, ec) && !fs::is_directory(out, ec)) throw InputError("--output " + out.string() + ": is a file; give a new or empty folder");
    if (fs::is_directory(out, ec) && !fs::is_empty(out, ec))
        throw InputError("--output " + out.string() + ": folder is not empty; give a new or empty folder");
}

ncnnport::seedvr2::Noise read_noise(const fs::path& path) {
    std::map<std::string, ncnnport::FloatArray> arrays;
    try {
        arrays = ncnnport::read_float_npz(path);
    } catch (const ncnnport::NpyError& e) {
        throw InputError(e.what());
    }
    if (!arrays.count("x_T")) throw InputError(path.string() + ": has no x_T array");
    for (const auto& [name, a] : arrays)
        if (name != "x_T" && name != "posterior") throw InputError(path.string() + ": unexpected array '" + name + "'");
    ncnnport::seedvr2::Noise n;
    n.x_T = arrays["x_T"];
    if (arrays.count("posterior")) n.posterior = arrays["posterior"];
    return n;
}

// Noise.record()'s sha256: float32 bytes of x_T, then of the posterior noise.
std::string noise_sha256(const ncnnport::seedvr2::Noise& n) {
    std::string bytes(reinterpret_cast<const char*>(n.x_T.data.data()), n.x_T.data.size() * 4);
    if (n.posterior) bytes.append(reinterpret_cast<const char*>(n.posterior->data.data()), n.posterior->data.size() * 4);
    return ncnnport::sha256_bytes(bytes);
}

// describe.frame_summary's numbers: sha256 of the uint8 bytes, mean, population std, min, max.
nlohmann::json frame_stats(const uint8_t* p, size_t n, std::vector<int64_t> shape) {
    double sum = 0;
    int lo = 255, hi = 0;
    for (size_t i = 0; i < n; ++i) sum += p[i], lo = std::min<int>(lo, p[i]), hi = std::max<int>(hi, p[i]);
    const double mean = sum / static_cast<double>(n);
    double var = 0;
    for (size_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
    return {{"sha256", ncnnport::sha256_bytes(std::string(reinterpret_cast<const char*>(p), n))},
            {"shape", shape}, {"mean", mean}, {"std", std::sqrt(var / static_cast<double>(n))}, {"min", lo}, {"max", hi}};
}

int run(const Args& a) {
    // inputs first (cheap, and what a user most often gets wrong), then the package
    check_output(a.input, a.output);
    const Frames input = read_frames(a.input);
    const auto noise = read_noise(a.noise);
    if (a.check) {
        const auto result = ncnnport::check_package(a.package);
        if (!result.problems.empty()) throw InputError(a.package.string() + ": " + result.problems.front());
    }
    std::unique_ptr<ncnnport::seedvr2::Pipeline> pipe;
    try {
        pipe = std::make_unique<ncnnport::seedvr2::Pipeline>(a.package, ncnnport::seedvr2::RunOptions{a.threads, a.vulkan, a.precision});
    } catch (const ncnnport::seedvr2::GraphError&) {
        throw;
    } catch (const std::exception& e) {
        throw InputError(e.what());
    }
    if (!a.dump_dir.empty()) {
        fs::create_directories(a.dump_dir);
        pipe->set_dump_dir(a.dump_dir);
    }
    int64_t area = a.area;
    try {
        if (!area) area = pipe->default_area(input.h, input.w);
    } catch (const std::exception& e) {
        throw InputError(e.what());
    }
    ncnnport::seedvr2::Timings timings;
    Frames out;
    try {
        out = pipe->restore(input, noise, area, a.colour_fix, &timings, a.perturb);
    } catch (const std::invalid_argument& e) {
        throw InputError(a.noise.string() + ": " + e.what());
    }
    fs::create_directories(a.output);
    nlohmann::json frames = nlohmann::json::array();
    const size_t plane = static_cast<size_t>(out.h) * out.w * 3;
    for (int i = 0; i < out.t; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "frame_%05d.png", i);
        ncnnport::RgbImage img{out.w, out.h, std::vector<uint8_t>(out.rgb.begin() + i * plane, out.rgb.begin() + (i + 1) * plane)};
        ncnnport::write_png(a.output / name, img);
        nlohmann::json st = frame_stats(img.rgb.data(), plane, {out.h, out.w, 3});
        st["path"] = (a.output / name).string();
        frames.push_back(st);
    }
    std::cout << "wrote " << out.t << " frame(s) " << out.w << "x" << out.h << " to " << a.output.string() << " ["
              << ncnnport::checked_precision(a.precision, a.vulkan).label() << "/t" << a.threads << (a.vulkan ? "/vulkan" : "") << ", area " << area << ", noise sha256 "
              << noise_sha256(noise).substr(0, 16) << ", " << timings.seconds["total"] << " s]\n";
    if (!a.json_out.empty()) {
        nlohmann::json all = frame_stats(out.rgb.data(), out.rgb.size(), {out.t, out.h, out.w, 3});
        nlohmann::json doc = {{"runtime", "cpp"}, {"model", "seedvr2"}, {"package", a.package.string()},
                              {"input", a.input.string()}, {"area", area}, {"threads", a.threads}, {"vulkan", a.vulkan},
                              {"colour_fix", a.colour_fix}, {"frames_sha256", all["sha256"]}, {"shape", all["shape"]},
                              {"mean", all["mean"]}, {"std", all["std"]}, {"min", all["min"]}, {"max", all["max"]},
                              {"frames", frames},
                              {"noise", {{"sha256", noise_sha256(noise)}, {"shape", noise.x_T.shape},
                                         {"posterior", noise.posterior ? "sample" : "mean"}}},
                              {"seconds", timings.seconds}, {"graphs", timings.graphs}};
        doc.update(ncnnport::precision_record(a.precision));  // the flags the nets carried
        std::ofstream js(a.json_out);
        js << doc.dump(2) << "\n";
        if (!js) throw std::runtime_error(a.json_out.string() + ": cannot write");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args args = parse(argc, argv);
        if (args.verify) return ncnnport::run_verify(args.package, {args.threads, args.vulkan, ncnnport::GemvChoice::Auto, args.precision},
                                                      "ncnnport-seedvr2: ");
        return run(args);
    } catch (const InputError& e) {
        std::cerr << "ncnnport-seedvr2: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-seedvr2: " << e.what() << "\n";
        return 1;
    }
}
