// ncnnport-memory-data-check: ncnnport's copy-free MemoryData (memory_data_layer.h) against ncnn's
// built-in MemoryData where the constant feeds layers that run in place.
//
//   ncnnport-memory-data-check [--calls N] [--no-lightmode] [--n N]
//
// Why: the overwrite hands the layer's own data to the next layer; that is only safe if ncnn
// copies the blob before an in-place layer writes it. The graph makes it try: the constant c
// (N values, some negative) goes through a Split into a ReLU and a BinaryOp adding 1 (both in
// place) and is extracted itself; a second MemoryData d with the same values feeds a ReLU
// directly. Both nets load
// the same .param and .bin; the test net registers the overwrite. Each of --calls extractions must
// give relu(c), relu(c), c + 1 and c exactly as the host computes them from the .bin's values,
// call after call (a shared constant written in place would change the later calls).
// Prints one JSON object: "shares" (outputs the overwrite handed on without a copy), per net and
// call whether each blob equals the host's values. Exit 0 after printing (the test judges), 2 on
// bad arguments or an ncnn error.
#include <mat.h>
#include <net.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ncnnport/cli_args.h"
#include "ncnnport/memory_data_layer.h"
#include "ncnnport/ncnn_graph.h"

namespace {

struct Args {
    int calls = 3, n = 1000;
    bool lightmode = true;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        auto value = [&]() -> int {  // the executables' one integer rule (cli_args.h)
            if (i + 1 >= argc) throw ncnnport::UsageError(f + " needs a value");
            return ncnnport::int_arg(f, argv[++i], 1);
        };
        if (f == "--calls") a.calls = value();
        else if (f == "--n") a.n = value();
        else if (f == "--no-lightmode") a.lightmode = false;
        else throw ncnnport::UsageError("unknown option " + f);
    }
    return a;
}

std::string param_text(int n) {
    std::ostringstream s;
    s << "7767517\n6 8\n"
      << "MemoryData c 0 1 c 0=" << n << "\n"
      << "MemoryData d 0 1 d 0=" << n << "\n"
      << "Split split 1 3 c c0 c1 c2\n"
      << "ReLU relu_direct 1 1 d relu0\n"
      << "ReLU relu_split 1 1 c1 relu1\n"
      << "BinaryOp add_one 1 1 c2 plus1 0=0 1=1 2=1.0\n";
    return s.str();
}

// c[i] = (i % 7) - 3 + i / n: negative and positive values, none an integer past the first few
std::vector<float> constant(int n) {
    std::vector<float> c(n);
    for (int i = 0; i < n; ++i) c[i] = static_cast<float>(i % 7) - 3.f + static_cast<float>(i) / static_cast<float>(n);
    return c;
}

void open_net(ncnn::Net& net, const Args& a, const std::vector<unsigned char>& bin, bool overwrite) {
    net.opt = ncnnport::fp32_options(1, false);
    net.opt.lightmode = a.lightmode;
    if (overwrite && !ncnnport::register_memory_data_layer(net)) throw std::runtime_error("register_custom_layer refused MemoryData");
    if (net.load_param_mem(param_text(a.n).c_str()) != 0) throw std::runtime_error("load_param_mem failed");
    if (net.load_model(bin.data()) != bin.size()) throw std::runtime_error("load_model read another size");
}

bool equals(const ncnn::Mat& m, const std::vector<float>& want) {
    return m.dims == 1 && m.w == static_cast<int>(want.size()) && m.elempack == 1 && m.elemsize == sizeof(float)
           && std::memcmp(m.data, want.data(), want.size() * sizeof(float)) == 0;
}

nlohmann::json calls(ncnn::Net& net, const Args& a, const std::vector<float>& c) {
    std::vector<float> relu(c), plus1(c);
    for (float& v : relu) v = std::max(v, 0.f);
    for (float& v : plus1) v += 1.f;
    nlohmann::json out = nlohmann::json::array();
    for (int call = 0; call < a.calls; ++call) {
        ncnn::Extractor ex = net.create_extractor();
        ncnn::Mat r0, r1, p1, raw;
        // the in-place consumers first, the constant last: a constant they wrote would show (and
        // in the next call's relu_direct, which reads d again)
        if (ex.extract("relu0", r0) != 0 || ex.extract("relu1", r1) != 0 || ex.extract("plus1", p1) != 0
            || ex.extract("c0", raw) != 0)
            throw std::runtime_error("extract failed");
        out.push_back({{"relu_direct", equals(r0, relu)}, {"relu_split", equals(r1, relu)}, {"add_one", equals(p1, plus1)},
                       {"constant", equals(raw, c)}});
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args a = parse(argc, argv);
        const std::vector<float> c = constant(a.n);
        // the two MemoryData records: raw fp32 (load_type 1), c then d
        std::vector<unsigned char> bin(2 * c.size() * sizeof(float));
        std::memcpy(bin.data(), c.data(), bin.size() / 2);
        std::memcpy(bin.data() + bin.size() / 2, c.data(), bin.size() / 2);
        ncnn::Net reference, test;
        open_net(reference, a, bin, false);
        open_net(test, a, bin, true);
        const nlohmann::json builtin = calls(reference, a, c);
        const uint64_t before = ncnnport::memory_data_shares();
        const nlohmann::json overwrite = calls(test, a, c);
        std::cout << nlohmann::json{{"lightmode", a.lightmode}, {"shares", ncnnport::memory_data_shares() - before},
                                    {"builtin", builtin}, {"overwrite", overwrite}}.dump()
                  << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-memory-data-check: " << e.what() << "\n";
        return 2;
    }
}
