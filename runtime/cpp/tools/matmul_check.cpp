// ncnnport-matmul-check: ncnnport's MatMul overwrite (matmul_layer.h) against ncnn's built-in
// MatMul on one random batched product, both ways (transB 1: scores q K^T, transB 0: weights V).
//
//   ncnnport-matmul-check --heads H --m M --k K --n N [--trans-b 0|1] [--threads T] [--seed S]
//                         [--rounds R] [--cold] [--dump PATH] [--fp16-cache] [--avx2]
//
// Why: the overwrite must compute what the built-in computes up to fp32 summation order, and the
// tests must see that its kernel ran rather than the built-in it delegates to. Both nets load the
// same one-layer .param (A = [H, M, K]; B = [H, N, K] with transB, else [H, K, N]); the test net
// registers the overwrite, the reference does not. Per output the bound is
//   bound = 2 * gamma(K + 1) * sum_k |a_k b_k|,  gamma(n) = n u / (1 - n u), u = 2^-24:
// each result is within gamma(K + 1) * S of the exact sum of the same products in any order of
// additions (fused or not), so two orders differ by at most twice that. ncnn's Gemm itself does
// not add in one order (it matched a k-ascending chain of fused multiply-adds bit for bit at some
// sizes and not at others), so the bound, not bit equality, is the contract.
// --rounds R > 0 also times both, interleaved call by call (median ms of each), so the layer's
// own gain is measured without a model around it; --cold reads a 256 MB buffer before every
// timed call, so the operands come from DRAM as they do in a decode step (the weights streamed
// between two steps evict the K/V cache), not from the cache the previous call warmed.
// Prints one JSON object: "registered", "many_rows" (whether M > kStreamMaxRows runs the
// overwrite's kernels on this CPU), the shapes, "kernel_calls" (the overwrite's own products),
// "max_abs_diff", "max_diff_over_bound", "bit_equal", and with --rounds the two medians. With
// --trans-b 0, and with --trans-b 1 where the many-row kernels run (M > kStreamMaxRows), also
// "equals_fma_chain": whether every output of the overwrite is bit for bit the k-ascending chain
// of fused multiply-adds from zero, the order those kernels promise.
// With --rounds, "rounds_equal_first": whether every timed call of the overwrite gave the first
// call's bits. "prefetch" is the attention prefetch choice of the product's kind (gemv_prefetch.h):
// the few-row kernels alternate prefetching and plain calls while they sample, so a run of at
// least 2 x kGemvPrefetchSamples calls over kPastL2PrefetchMinBytes compares both variants' bits.
// --fp16-cache: B holds fp16 values (rounded to nearest even) and the overwrite's net gets them
// as 2-byte fp16 bits, as a K/V cache of fp16 rows reaches it (kv_cache.h KvRows::Fp16); the
// reference gets the same values as floats. The stream kernels widen on load (exact), so the
// bound above holds unchanged; past their rows the overwrite widens B for the built-in, which then
// gives the reference's bits ("fp16_cache" in the JSON).
// --avx2 limits the stream kernels to their 8-lane copies on an AVX-512 CPU
// (matmul_layer_limit_to_avx2); "isa" names the copy that ran ("ncnnport-avx512" / "-avx2").
// --dump PATH writes the overwrite's output (fp32, [heads, m, n]) there, so runs can be compared
// bit for bit (e.g. at two thread counts). Exit 0
// after printing (the test judges), 2 on bad arguments or an ncnn error.
#include <mat.h>
#include <net.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "interleaved_timing.h"
#include "ncnnport/fp16.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/huge_page_allocator.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/matmul_layer.h"

namespace {

struct Args {
    int heads = 0, m = 0, k = 0, n = 0, trans_b = 1, threads = 1, rounds = 0;
    unsigned seed = 0;
    bool cold = false, fp16_cache = false, avx2 = false;
    std::string dump;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto value = [&]() -> int {
            if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
            return std::stoi(argv[++i]);
        };
        if (f == "--heads") a.heads = value();
        else if (f == "--m") a.m = value();
        else if (f == "--k") a.k = value();
        else if (f == "--n") a.n = value();
        else if (f == "--trans-b") a.trans_b = value();
        else if (f == "--threads") a.threads = value();
        else if (f == "--rounds") a.rounds = value();
        else if (f == "--seed") a.seed = static_cast<unsigned>(value());
        else if (f == "--cold") a.cold = true;
        else if (f == "--fp16-cache") a.fp16_cache = true;
        else if (f == "--avx2") a.avx2 = true;
        else if (f == "--dump") {
            if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
            a.dump = argv[++i];
        }
        else throw std::invalid_argument("unknown option " + f);
    }
    if (a.heads < 1 || a.m < 1 || a.k < 1 || a.n < 1 || a.threads < 1 || a.rounds < 0 || (a.trans_b != 0 && a.trans_b != 1))
        throw std::invalid_argument("--heads, --m, --k, --n, --threads >= 1, --rounds >= 0 and --trans-b 0|1 are required");
    return a;
}

// B (the cache operand) comes from the K/V cache's allocator (huge_page_allocator.h), as in the
// decode loops, so the timed reads see the pages a decode step reads.
ncnn::Mat random_mat(int w, int h, int c, std::mt19937& rng, ncnn::Allocator* allocator = nullptr) {
    std::normal_distribution<float> dist(0.f, 1.f);
    ncnn::Mat m(w, h, c, 4u, allocator);
    for (int p = 0; p < c; ++p) {
        float* row = m.channel(p);
        for (int i = 0; i < w * h; ++i) row[i] = dist(rng);
    }
    return m;
}

// A one-layer net: inputs a, b -> MatMul (0=transB) -> out.
void open_net(ncnn::Net& net, const Args& a, bool overwrite) {
    net.opt = ncnnport::fp32_options(a.threads, false);  // what every C++ graph runs with
    if (overwrite) ncnnport::register_matmul_layer(net);  // false where the CPU lacks AVX2 / FMA: "registered" says so
    const std::string param = "7767517\n3 3\nInput a 0 1 a\nInput b 0 1 b\nMatMul mm 2 1 a b out 0=" + std::to_string(a.trans_b) + "\n";
    if (net.load_param_mem(param.c_str()) != 0) throw std::runtime_error("load_param_mem failed");
    const unsigned char* none = nullptr;
    net.load_model(none);
}

// B's values rounded to fp16 in place, and the same values as fp16 bits in a Mat of 2-byte
// elements from the cache's allocator.
ncnn::Mat round_to_fp16(ncnn::Mat& B, ncnn::Allocator* allocator) {
    ncnn::Mat half(B.w, B.h, B.c, 2u, allocator);
    for (int p = 0; p < B.c; ++p) {
        float* row = B.channel(p);
        auto* bits = static_cast<uint16_t*>(half.channel(p).data);
        for (int i = 0; i < B.w * B.h; ++i) {
            bits[i] = ncnnport::fp16_bits(row[i]);
            row[i] = ncnnport::fp16_value(bits[i]);
        }
    }
    return half;
}

ncnn::Mat run(ncnn::Net& net, const ncnn::Mat& A, const ncnn::Mat& B) {
    ncnn::Extractor ex = net.create_extractor();
    ex.input("a", A);
    ex.input("b", B);
    ncnn::Mat out;
    if (ex.extract("out", out) != 0) throw std::runtime_error("extract failed");
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args a = parse(argc, argv);
        ncnnport::matmul_layer_limit_to_avx2(a.avx2);
        std::mt19937 rng(a.seed);
        const ncnn::Mat A = random_mat(a.k, a.m, a.heads, rng);
        ncnn::Allocator* cache = ncnnport::huge_page_allocator();
        ncnn::Mat B = a.trans_b ? random_mat(a.k, a.n, a.heads, rng, cache) : random_mat(a.n, a.k, a.heads, rng, cache);
        const ncnn::Mat B_test = a.fp16_cache ? round_to_fp16(B, cache) : B;  // the operand the overwrite gets
        ncnn::Net reference, test;
        open_net(reference, a, false);
        open_net(test, a, true);
        const uint64_t calls_before = ncnnport::matmul_layer_calls();
        const ncnn::Mat want = run(reference, A, B), got = run(test, A, B_test);
        const uint64_t kernel_calls = ncnnport::matmul_layer_calls() - calls_before;
        if (want.w != got.w || want.h != got.h || want.c != got.c) throw std::runtime_error("output shapes differ");
        if (want.w != a.n || want.h != a.m || want.c != a.heads) throw std::runtime_error("output is not [heads, m, n]");
        const double u = std::ldexp(1.0, -24), gamma = (a.k + 1) * u / (1 - (a.k + 1) * u);
        double max_diff = 0.0, max_ratio = 0.0;
        bool bit_equal = true, equals_chain = true;
        // the orders the kernels promise: the weighted sums always, the scores of the many-row
        // kernels too (every output one chain); the few-row scores add partial sums
        const bool chain_promised = !a.trans_b || (a.m > ncnnport::kStreamMaxRows && ncnnport::matmul_many_rows_supported());
        for (int p = 0; p < a.heads; ++p) {
            const float* w = want.channel(p);
            const float* g = got.channel(p);
            const float* ap = A.channel(p);
            const float* bp = B.channel(p);
            for (int m = 0; m < a.m; ++m)
                for (int n = 0; n < a.n; ++n) {
                    double s = 0.0;  // sum_k |a_k b_k| of this output
                    for (int k = 0; k < a.k; ++k)
                        s += std::fabs(static_cast<double>(ap[m * a.k + k]) * (a.trans_b ? bp[n * a.k + k] : bp[k * a.n + n]));
                    const int i = m * a.n + n;
                    const double diff = std::fabs(static_cast<double>(w[i]) - g[i]);
                    max_diff = std::max(max_diff, diff);
                    const double bound = 2 * gamma * s;
                    max_ratio = std::max(max_ratio, bound > 0 ? diff / bound : (diff > 0 ? INFINITY : 0.0));
                    bit_equal = bit_equal && std::memcmp(&w[i], &g[i], sizeof(float)) == 0;
                    if (chain_promised) {
                        float chain = 0.f;
                        for (int k = 0; k < a.k; ++k)
                            chain = std::fma(ap[m * a.k + k], a.trans_b ? bp[n * a.k + k] : bp[k * a.n + n], chain);
                        equals_chain = equals_chain && std::memcmp(&chain, &g[i], sizeof(float)) == 0;
                    }
                }
        }
        nlohmann::json out = {{"registered", ncnnport::matmul_layer_supported()},
                              {"isa", ncnnport::matmul_layer_label(ncnnport::matmul_layer_supported())},
                              {"many_rows", ncnnport::matmul_many_rows_supported()}, {"heads", a.heads}, {"m", a.m}, {"k", a.k}, {"n", a.n}, {"trans_b", a.trans_b},
                              {"threads", a.threads}, {"out_shape", {want.c, want.h, want.w}},
                              {"kernel_calls", kernel_calls}, {"max_abs_diff", max_diff}, {"max_diff_over_bound", max_ratio},
                              {"bit_equal", bit_equal}, {"fp16_cache", a.fp16_cache}};
        if (chain_promised) out["equals_fma_chain"] = equals_chain;
        if (!a.dump.empty()) {
            std::ofstream f(a.dump, std::ios::binary);
            for (int p = 0; p < got.c; ++p)
                f.write(reinterpret_cast<const char*>(static_cast<const float*>(got.channel(p))),
                        static_cast<std::streamsize>(sizeof(float)) * got.w * got.h);
            if (!f) throw std::runtime_error("cannot write " + a.dump);
        }
        if (a.rounds > 0) {
            bool rounds_equal = true;  // every timed call of the overwrite gave the first call's bits
            auto timed_test = [&] {
                const ncnn::Mat again = run(test, A, B_test);
                for (int p = 0; p < got.c; ++p)
                    rounds_equal = rounds_equal && std::memcmp(again.channel(p), got.channel(p), sizeof(float) * got.w * got.h) == 0;
            };
            const auto m = ncnnport::check::interleaved_medians([&] { run(reference, A, B); }, timed_test, a.rounds, a.cold);
            out["cold"] = a.cold;
            out["ncnn_ms"] = m.reference_ms;
            out["kernel_ms"] = m.test_ms;
            out["rounds_equal_first"] = rounds_equal;
        }
        out["prefetch"] = ncnnport::attention_prefetch_json(a.trans_b != 0);
        out["prefetch_distance"] = ncnnport::prefetch_report_json(ncnnport::attention_prefetch_distance_choice(a.trans_b != 0).report());
        std::cout << out.dump() << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-matmul-check: " << e.what() << "\n";
        return 2;
    }
}
