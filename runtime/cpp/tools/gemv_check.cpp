// ncnnport-gemv-check: ncnnport's InnerProduct overwrite (gemv_layer.h) against ncnn's built-in
// InnerProduct on one random layer, over a sequence of calls on the same two nets.
//
//   ncnnport-gemv-check --n N --k K [--rows 1,5,1] [--bias] [--threads T] [--fp16-storage]
//                       [--fp16-bin] [--act 0..3] [--dims1] [--seed S] [--avx2] [--same-input]
//                       [--streams 1|4]
//
// Why: the overwrite must compute what the built-in computes, up to fp32 summation order, on
// every path it takes (its own kernel for one row, the built-in it delegates to for several rows,
// that built-in created lazily after the kernel's weights, and from fp16 .bin records), and the
// tests must see which path ran. Both nets load the same .param text and .bin bytes (built here
// from seeded random values); the test net registers the overwrite, the reference does not.
//
// Prints one JSON object: per call the rows, the overwrite's one-row products during it
// ("gemv_calls"), the sha256 of the overwrite's output bits ("out_sha256"), max |diff| and the largest
// diff / bound ratio, where per output
//   bound = 2 * gamma(K + 1) * (|b| + sum_k |w_k x_k|),  gamma(n) = n u / (1 - n u), u = 2^-24:
// each result is within gamma(K + 1) * S of the exact sum of the same products whatever the order
// (bias first, K fused or separate multiply-adds), so two orders differ by at most twice that.
// Under fp16 storage both must hold the same fp16 weights (the overwrite mirrors ncnn's
// conversion), and |fp16(w)| <= |w| (1 + 2^-11) widens S by that factor. relu / clip do not widen
// a difference; leakyrelu scales it by at most max(1, |slope|).
// --same-input feeds every call the first call's input (the rows must all be equal), so the
// outputs' hashes show whether the calls the prefetch choice alternated (gemv_prefetch.h) gave
// the same bits; "prefetch" in the JSON is that choice for the layer's weight width, and
// "prefetch_distance" the choice between the two distances among its prefetching calls.
// --avx2 limits the kernel to its 8-lane copy on an AVX-512 CPU (gemv_layer_limit_to_avx2); "isa"
// in the JSON is the copy that ran (gemv_layer_label). The 8-lane copy packs the narrow layout
// (16-output blocks) where AVX-512F is absent or limited; --streams forces it to read one block at a
// time or 4 side by side (default: its choice, gemv_streams_choice, "streams" in the JSON).
// Exit 0 after printing (the test judges), 2 on bad arguments or an ncnn error.
#include "ncnnport/gemv_prefetch.h"

#include <layer.h>
#include <mat.h>
#include <net.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ncnnport/gemv_layer.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/sha256.h"

namespace {

struct Args {
    int n = 0, k = 0, threads = 1, act = 0;
    std::vector<int> rows{1};
    bool bias = false, fp16_storage = false, fp16_bin = false, dims1 = false, avx2 = false, same_input = false;
    int streams = 0;
    unsigned seed = 0;
};

std::vector<int> parse_rows(const std::string& s) {
    std::vector<int> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
    return out;
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
            return argv[++i];
        };
        if (f == "--n") a.n = std::stoi(value());
        else if (f == "--k") a.k = std::stoi(value());
        else if (f == "--rows") a.rows = parse_rows(value());
        else if (f == "--threads") a.threads = std::stoi(value());
        else if (f == "--act") a.act = std::stoi(value());
        else if (f == "--seed") a.seed = static_cast<unsigned>(std::stoul(value()));
        else if (f == "--bias") a.bias = true;
        else if (f == "--fp16-storage") a.fp16_storage = true;
        else if (f == "--fp16-bin") a.fp16_bin = true;
        else if (f == "--dims1") a.dims1 = true;
        else if (f == "--avx2") a.avx2 = true;
        else if (f == "--streams") {
            if (i + 1 >= argc) throw std::invalid_argument("--streams needs 1 or 4");
            a.streams = std::stoi(argv[++i]);
            if (a.streams != 1 && a.streams != 4) throw std::invalid_argument("--streams needs 1 or 4");
        }
        else if (f == "--same-input") a.same_input = true;
        else throw std::invalid_argument("unknown option " + f);
    }
    if (a.n < 1 || a.k < 1 || a.rows.empty() || a.threads < 1 || a.act < 0 || a.act > 3)
        throw std::invalid_argument("--n, --k, --rows, --threads >= 1 and --act 0..3 are required");
    if (a.same_input && std::count(a.rows.begin(), a.rows.end(), a.rows.front()) != static_cast<long>(a.rows.size()))
        throw std::invalid_argument("--same-input needs every --rows entry equal");
    return a;
}

// The activation's parameters: leakyrelu slope 0.1, clip [-0.5, 0.5].
std::vector<float> act_params(int act) {
    if (act == 2) return {0.1f};
    if (act == 3) return {-0.5f, 0.5f};
    return {};
}

std::string param_text(const Args& a) {
    std::ostringstream s;
    s << "7767517\n2 2\nInput in 0 1 in\nInnerProduct ip 1 1 in out 0=" << a.n << " 1=" << (a.bias ? 1 : 0)
      << " 2=" << static_cast<int64_t>(a.n) * a.k << " 9=" << a.act;
    const auto p = act_params(a.act);
    if (!p.empty()) {
        s << " -23310=" << p.size();
        for (float v : p) s << "," << v;
    }
    s << "\n";
    return s.str();
}

// The .bin: weight records with ncnn's storage tag (0 fp32, 0x01306B47 fp16, padded to 4 bytes),
// then the bias as a raw fp32 record.
std::vector<unsigned char> model_bytes(const Args& a, const std::vector<float>& w, const std::vector<float>& b) {
    std::vector<unsigned char> out;
    auto put = [&out](const void* p, size_t n) {
        const auto* c = static_cast<const unsigned char*>(p);
        out.insert(out.end(), c, c + n);
    };
    const uint32_t tag = a.fp16_bin ? 0x01306B47u : 0u;
    put(&tag, 4);
    if (a.fp16_bin) {
        for (float v : w) {
            const unsigned short h = ncnn::float32_to_float16(v);
            put(&h, 2);
        }
        while (out.size() % 4) out.push_back(0);
    } else {
        put(w.data(), w.size() * 4);
    }
    if (a.bias) put(b.data(), b.size() * 4);
    return out;
}

// The weights as the nets hold them after loading (fp16 records widen exactly).
std::vector<float> loaded_weights(const Args& a, std::vector<float> w) {
    if (a.fp16_bin)
        for (float& v : w) v = ncnn::float16_to_float32(ncnn::float32_to_float16(v));
    return w;
}

void load(ncnn::Net& net, const Args& a, const std::string& param, const std::vector<unsigned char>& bin) {
    net.opt = ncnnport::fp32_options(a.threads, false);
    net.opt.use_fp16_storage = a.fp16_storage;
    if (net.load_param_mem(param.c_str()) != 0) throw std::runtime_error("ncnn could not load the param text");
    if (net.load_model(bin.data()) != bin.size()) throw std::runtime_error("ncnn could not load the model bytes");
}

ncnn::Mat run(ncnn::Net& net, const ncnn::Mat& in) {
    ncnn::Extractor ex = net.create_extractor();
    ncnn::Mat out;
    if (ex.input("in", in) != 0 || ex.extract("out", out) != 0) throw std::runtime_error("ncnn forward failed");
    ncnn::Mat flat;
    ncnn::convert_packing(out, flat, 1);
    return flat;
}

double gamma(int n) {
    const double u = std::ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

// Per-call comparison of the two nets' outputs against the derived bound.
nlohmann::json compare(const Args& a, const std::vector<float>& w, const std::vector<float>& b, const ncnn::Mat& x,
                       int rows, const ncnn::Mat& ref, const ncnn::Mat& got) {
    const float* r = ref;
    const float* g = got;
    const double slope = a.act == 2 ? std::max(1.0, std::fabs(static_cast<double>(act_params(2)[0]))) : 1.0;
    double max_diff = 0.0, max_ratio = 0.0;
    size_t identical = 0;
    for (int m = 0; m < rows; ++m) {
        const float* xm = static_cast<const float*>(x.data) + static_cast<size_t>(m) * a.k;
        for (int o = 0; o < a.n; ++o) {
            const double widen = a.fp16_storage ? 1.0 + std::ldexp(1.0, -11) : 1.0;
            double s = 0.0;
            for (int k = 0; k < a.k; ++k) s += std::fabs(static_cast<double>(w[static_cast<size_t>(o) * a.k + k]) * xm[k]);
            s = s * widen + (a.bias ? std::fabs(b[o]) : 0.0);
            const double bound = slope * 2.0 * gamma(a.k + 1) * s;
            const size_t i = static_cast<size_t>(m) * a.n + o;
            const double d = std::fabs(static_cast<double>(r[i]) - g[i]);
            identical += r[i] == g[i];
            max_diff = std::max(max_diff, d);
            max_ratio = std::max(max_ratio, bound > 0 ? d / bound : (d > 0 ? INFINITY : 0.0));
        }
    }
    return {{"rows", rows}, {"max_abs_diff", max_diff}, {"max_diff_over_bound", max_ratio},
            {"identical", identical}, {"outputs", static_cast<size_t>(rows) * a.n},
            {"out_sha256", ncnnport::sha256_bytes(std::string(reinterpret_cast<const char*>(g), static_cast<size_t>(rows) * a.n * sizeof(float)))}};
}

int run_check(const Args& a) {
    std::mt19937 rng(a.seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> w(static_cast<size_t>(a.n) * a.k), b(a.n);
    for (float& v : w) v = uni(rng);
    for (float& v : b) v = uni(rng);
    const std::string param = param_text(a);
    const std::vector<unsigned char> bin = model_bytes(a, w, b);
    ncnn::Net ref, test;
    load(ref, a, param, bin);
    ncnnport::gemv_layer_limit_to_avx2(a.avx2);
    ncnnport::gemv_layer_force_streams(a.streams);
    const bool registered = ncnnport::register_gemv_layer(test);
    load(test, a, param, bin);
    const std::vector<float> wl = loaded_weights(a, w);

    nlohmann::json calls = nlohmann::json::array();
    ncnn::Mat first;
    for (int rows : a.rows) {
        ncnn::Mat x = rows == 1 && a.dims1 ? ncnn::Mat(a.k) : ncnn::Mat(a.k, rows);
        for (size_t i = 0; i < x.total(); ++i) x[i] = uni(rng);
        if (a.same_input) {
            if (first.empty()) first = x.clone();
            x = first;
        }
        const ncnn::Mat r = run(ref, x);
        const uint64_t before = ncnnport::gemv_layer_calls();
        const ncnn::Mat g = run(test, x);
        nlohmann::json c = compare(a, wl, b, x, rows, r, g);
        c["gemv_calls"] = ncnnport::gemv_layer_calls() - before;
        c["out_dims"] = g.dims;
        c["ref_dims"] = r.dims;
        calls.push_back(c);
    }
    const nlohmann::json prefetch = ncnnport::gemv_prefetch_json(a.fp16_storage);
    std::cout << nlohmann::json{{"registered", registered}, {"isa", ncnnport::gemv_layer_label(registered)},
                                {"prefetch", prefetch},
                                {"streams", ncnnport::prefetch_report_json(ncnnport::gemv_streams_choice(a.fp16_storage).report())},
                                {"prefetch_distance", ncnnport::prefetch_report_json(
                                                          ncnnport::gemv_prefetch_distance_choice(a.fp16_storage).report())},
                                {"calls", calls}}.dump() << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run_check(parse(argc, argv));
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-gemv-check: " << e.what() << "\n";
        return 2;
    }
}
