// ncnnport-int8-gemv-check: ncnnport's int8 Gemm overwrite (int8_gemv_layer.h) against ncnn's
// built-in Gemm on one random int8-weights layer, the layer package-int8w's decode graphs hold
// (convert/int8_weights.py: quantize_term 80y, transB, constant B, C per column or none).
//
//   ncnnport-int8-gemv-check --n N --k K [--block 32|64|128] [--bias 0|1] [--rows M] [--threads T]
//                            [--seed S] [--rounds R] [--cold] [--avx2] [--minus-128]
//                            [--streams 1|4]
//
// Why: the overwrite must compute what the built-in computes, and the tests must see that its
// kernel ran rather than the built-in it delegates to. Both nets load the same one-layer .param
// and the same in-memory .bin (B as int8 [N][K], C, the scales [N][blocks] of 127/absmax of
// normal weights); the test net registers the overwrite, the reference does not. A is [M][K]
// normal values (M = 1: the decode row; more rows go to the built-in inside the overwrite).
// Both quantize A identically (per block, absmax), so each block's integer sum is the same exact
// integer and only the fp32 additions over the blocks can differ. Per output the bound is
//   bound = 2 * gamma(blocks + 2) * (sum_g d_g sum_k (|a_k| + s_g) |b_k| + |c|),
// with s_g = absmax_g / 127 the input's step and d_g = 1 / scale_g the weights': each term
// q_k b_k s_g d_g is at most (|a_k| + s_g) |b_k| d_g, and each result is within gamma(n) of the
// exact sum of its n rounded terms. An input element quantized one step apart moves an output
// by s_g |b_k| d_g, far outside it.
// --rounds R > 0 also times both, interleaved call by call (median ms of each); --cold reads a
// 256 MB buffer before every timed call, so the weights come from DRAM as in a decode step.
// --avx2 limits the overwrite to its AVX2 copy on an AVX-512 VNNI CPU (int8_gemv_layer_limit_to_avx2),
// so the tests run both copies on one machine; "isa" names the copy that ran and "out_sha256"
// hashes the overwrite's output bits (both copies must give the same). --minus-128 sets the first
// weight to -128 (outside the +-127 ncnn's quantizer writes), which the AVX2 copy must not take.
// --streams forces the AVX2 copy to read one row group at a time or 4 side by side (default: its
// choice on the machine, int8_gemv_streams_choice; "streams" in the JSON reports that choice).
// Prints one JSON object: "registered", "isa", the shapes, "kernel_calls", "max_abs_diff",
// "max_diff_over_bound", "bit_equal", "weight_bytes", "kernel_weights_huge_bytes" (the kernel's
// copy in the huge-page arena, kernel_weight_allocator.h) and with --rounds the two
// medians, both GB/s and "rounds_equal_first" (every timed call of the overwrite gave the first
// call's bits; "prefetch", the kernel's prefetch choice, gemv_prefetch.h, says whether the calls
// alternated plain and prefetching variants while it sampled; "prefetch_distance" its choice between
// the two distances among the prefetching calls). Exit 0 after printing (the test judges), 2 on bad arguments or an ncnn error.
#include <mat.h>
#include <net.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "interleaved_timing.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/int8_gemv_layer.h"
#include "ncnnport/kernel_weight_allocator.h"
#include "ncnnport/sha256.h"

namespace {

struct Args {
    int n = 0, k = 0, block = 128, bias = 1, rows = 1, threads = 1, rounds = 0;
    unsigned seed = 0;
    bool cold = false, avx2 = false, minus_128 = false;
    int streams = 0;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto value = [&]() -> int {
            if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
            return std::stoi(argv[++i]);
        };
        if (f == "--n") a.n = value();
        else if (f == "--k") a.k = value();
        else if (f == "--block") a.block = value();
        else if (f == "--bias") a.bias = value();
        else if (f == "--rows") a.rows = value();
        else if (f == "--threads") a.threads = value();
        else if (f == "--rounds") a.rounds = value();
        else if (f == "--seed") a.seed = static_cast<unsigned>(value());
        else if (f == "--cold") a.cold = true;
        else if (f == "--avx2") a.avx2 = true;
        else if (f == "--minus-128") a.minus_128 = true;
        else if (f == "--streams") a.streams = value();
        else throw std::invalid_argument("unknown option " + f);
    }
    if (a.n < 1 || a.k < 1 || a.rows < 1 || a.threads < 1 || a.rounds < 0 || (a.bias != 0 && a.bias != 1)
        || (a.block != 32 && a.block != 64 && a.block != 128)
        || (a.streams != 0 && a.streams != 1 && a.streams != ncnnport::int8_gemv_layer_side_by_side_streams()))
        throw std::invalid_argument("--n, --k, --rows, --threads >= 1, --rounds >= 0, --bias 0|1, --block 32|64|128 and --streams 1|4 are required");
    return a;
}

int block_code(int block) { return block == 32 ? 0 : block == 64 ? 1 : 2; }

// The layer's weights as the .bin holds them, and the values the bound needs.
struct Layer {
    std::vector<int8_t> q;        // [N][K]
    std::vector<float> scales;    // [N][blocks], 127 / absmax
    std::vector<float> bias;      // N, or empty
    std::vector<unsigned char> bin;
};

// Normal weights quantized as convert/int8_weights.py does (round half away from zero).
Layer make_layer(const Args& a, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.f, 1.f);
    const int blocks = (a.k + a.block - 1) / a.block;
    Layer l;
    l.q.resize(static_cast<size_t>(a.n) * a.k);
    l.scales.resize(static_cast<size_t>(a.n) * blocks);
    std::vector<float> w(a.k);
    for (int o = 0; o < a.n; ++o) {
        for (float& v : w) v = dist(rng);
        for (int b = 0; b < blocks; ++b) {
            const int k0 = b * a.block, k1 = std::min(a.k, k0 + a.block);
            float absmax = 0.f;
            for (int k = k0; k < k1; ++k) absmax = std::max(absmax, std::fabs(w[k]));
            const float scale = absmax > 0.f ? 127.f / absmax : 1.f;
            l.scales[static_cast<size_t>(o) * blocks + b] = scale;
            for (int k = k0; k < k1; ++k)
                l.q[static_cast<size_t>(o) * a.k + k] = static_cast<int8_t>(std::clamp(std::round(w[k] * scale), -127.f, 127.f));
        }
    }
    if (a.minus_128) l.q[0] = -128;
    if (a.bias)
        for (int o = 0; o < a.n; ++o) l.bias.push_back(dist(rng));
    auto put = [&](const void* p, size_t bytes) {
        const auto* c = static_cast<const unsigned char*>(p);
        l.bin.insert(l.bin.end(), c, c + bytes);
    };
    put(l.q.data(), l.q.size());
    l.bin.resize((l.bin.size() + 3) / 4 * 4, 0);
    if (a.bias) {
        const uint32_t fp32_tag = 0;
        put(&fp32_tag, 4);
        put(l.bias.data(), l.bias.size() * sizeof(float));
    }
    put(l.scales.data(), l.scales.size() * sizeof(float));
    return l;
}

// A one-layer net: input a -> Gemm (transB, constant B and C, quantize_term 80y) -> out.
void open_net(ncnn::Net& net, const Args& a, const Layer& l, bool overwrite) {
    net.opt = ncnnport::fp32_options(a.threads, false);  // what every C++ graph runs with
    if (overwrite) ncnnport::register_int8_gemv_layer(net);  // false where the CPU lacks AVX-512 VNNI: "registered" says so
    const std::string param = "7767517\n2 2\nInput a 0 1 a\nGemm gemm 1 1 a out 0=1.0 1=1.0 2=0 3=1 4=0 5=1 6=1 7=0 8="
                              + std::to_string(a.n) + " 9=" + std::to_string(a.k) + " 10=" + (a.bias ? "4" : "-1")
                              + " 18=" + std::to_string(800 + block_code(a.block)) + "\n";
    if (net.load_param_mem(param.c_str()) != 0) throw std::runtime_error("load_param_mem failed");
    if (net.load_model(l.bin.data()) != l.bin.size()) throw std::runtime_error("load_model read another size than the .bin");
}

ncnn::Mat run(ncnn::Net& net, const ncnn::Mat& A) {
    ncnn::Extractor ex = net.create_extractor();
    ex.input("a", A);
    ncnn::Mat out;
    if (ex.extract("out", out) != 0) throw std::runtime_error("extract failed");
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args a = parse(argc, argv);
        ncnnport::int8_gemv_layer_limit_to_avx2(a.avx2);
        ncnnport::int8_gemv_layer_force_streams(a.streams);
        std::mt19937 rng(a.seed);
        const Layer l = make_layer(a, rng);
        ncnn::Mat A(a.k, a.rows);
        std::normal_distribution<float> dist(0.f, 1.f);
        for (int i = 0; i < a.k * a.rows; ++i) A[i] = dist(rng);
        ncnn::Net reference, test;
        open_net(reference, a, l, false);
        open_net(test, a, l, true);
        const uint64_t calls_before = ncnnport::int8_gemv_layer_calls();
        const ncnn::Mat want = run(reference, A);
        const ncnn::Mat got = run(test, A);
        const uint64_t kernel_calls = ncnnport::int8_gemv_layer_calls() - calls_before;
        if (want.w != got.w || want.h != got.h || want.dims != got.dims) throw std::runtime_error("output shapes differ");
        if (want.dims != 2 || want.w != a.n || want.h != a.rows) throw std::runtime_error("output is not [rows, n]");
        const int blocks = (a.k + a.block - 1) / a.block;
        const double u = std::ldexp(1.0, -24), gamma = (blocks + 2) * u / (1 - (blocks + 2) * u);
        double max_diff = 0.0, max_ratio = 0.0;
        bool bit_equal = true;
        for (int m = 0; m < a.rows; ++m) {
            const float* x = static_cast<const float*>(A.data) + static_cast<size_t>(m) * a.k;
            std::vector<double> step(blocks);  // s_g: the input's quantization step per block
            for (int b = 0; b < blocks; ++b) {
                double absmax = 0.0;
                for (int k = b * a.block; k < std::min(a.k, (b + 1) * a.block); ++k) absmax = std::max(absmax, std::fabs(static_cast<double>(x[k])));
                step[b] = absmax / 127.0;
            }
            for (int o = 0; o < a.n; ++o) {
                double s = a.bias ? std::fabs(static_cast<double>(l.bias[o])) : 0.0;
                for (int b = 0; b < blocks; ++b) {
                    double t = 0.0;
                    for (int k = b * a.block; k < std::min(a.k, (b + 1) * a.block); ++k)
                        t += (std::fabs(static_cast<double>(x[k])) + step[b]) * std::abs(static_cast<int>(l.q[static_cast<size_t>(o) * a.k + k]));
                    s += t / l.scales[static_cast<size_t>(o) * blocks + b];
                }
                const float wv = want.row(m)[o], gv = got.row(m)[o];
                const double diff = std::fabs(static_cast<double>(wv) - gv);
                max_diff = std::max(max_diff, diff);
                const double bound = 2 * gamma * s;
                max_ratio = std::max(max_ratio, bound > 0 ? diff / bound : (diff > 0 ? INFINITY : 0.0));
                bit_equal = bit_equal && std::memcmp(&wv, &gv, sizeof(float)) == 0;
            }
        }
        const bool registered = ncnnport::int8_gemv_layer_supported();
        const std::string got_bits(static_cast<const char*>(got.data), sizeof(float) * got.w * got.h);
        nlohmann::json out = {{"registered", registered}, {"isa", ncnnport::int8_gemv_layer_label(registered)},
                              {"out_sha256", ncnnport::sha256_bytes(got_bits)}, {"n", a.n}, {"k", a.k}, {"block", a.block},
                              {"bias", a.bias}, {"rows", a.rows}, {"threads", a.threads}, {"out_shape", {want.h, want.w}},
                              {"kernel_calls", kernel_calls}, {"max_abs_diff", max_diff}, {"max_diff_over_bound", max_ratio},
                              {"bit_equal", bit_equal}, {"weight_bytes", l.q.size() + l.scales.size() * sizeof(float)},
                              {"kernel_weights_huge_bytes", ncnnport::kernel_weight_huge_bytes()}};
        if (a.rounds > 0) {
            bool rounds_equal = true;  // every timed call of the overwrite gave the first call's bits
            auto timed_test = [&] {
                const ncnn::Mat again = run(test, A);
                rounds_equal = rounds_equal && std::memcmp(again.data, got.data, sizeof(float) * got.w * got.h) == 0;
            };
            const auto m = ncnnport::check::interleaved_medians([&] { run(reference, A); }, timed_test, a.rounds, a.cold);
            out["rounds_equal_first"] = rounds_equal;
            out["cold"] = a.cold;
            out["ncnn_ms"] = m.reference_ms;
            out["kernel_ms"] = m.test_ms;
            out["kernel_gbps"] = static_cast<double>(out["weight_bytes"].get<size_t>()) / (m.test_ms * 1e6);
            out["ncnn_gbps"] = static_cast<double>(out["weight_bytes"].get<size_t>()) / (m.reference_ms * 1e6);
        }
        out["prefetch"] = ncnnport::int8_gemv_prefetch_json();
        out["prefetch_distance"] = ncnnport::prefetch_report_json(ncnnport::int8_gemv_prefetch_distance_choice().report());
        out["streams"] = ncnnport::prefetch_report_json(ncnnport::int8_gemv_streams_choice().report());
        std::cout << out.dump() << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-int8-gemv-check: " << e.what() << "\n";
        return 2;
    }
}
