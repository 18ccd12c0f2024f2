// ncnnport-view-check: a graph fed a cache VIEW must compute what it computes from a compact copy.
//
//   ncnnport-view-check PACKAGE GRAPH [--vulkan] [--threads N] [--spare ROWS]
//
// Why: the decoders hand ncnn their K/V cache as Mat headers over a larger buffer (kv_cache.h):
// h = the committed length, cstep = the owner's (capacity rows). ncnn's Vulkan upload
// (VkCompute::record_upload, 1.0.20261020) copies cstep * c elements into a staging buffer sized
// from the dims, so such a view overflowed the staging buffer and every channel after the first
// landed at the wrong offset (ncnnport::Graph clones non-compact inputs on Vulkan for this). This
// tool runs the graph's first golden case twice through ncnnport::Graph, once with compact Mats and
// once with every 3-D input (a rank-4 spec input) as a view into an owner with ROWS spare rows
// filled with NaN, and compares the outputs bit for bit (tests/cpp/test_cpp_vulkan.py).
//
// Exit 0 identical outputs, 1 an output differs, 2 bad arguments or a package it cannot run.
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <gpu.h>  // ncnn

#include "ncnnport/model_json.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/npz.h"

namespace {

struct Args {
    std::string package, graph;
    ncnnport::GraphOptions options;
    int spare = 5;
};

bool parse(int argc, char** argv, Args& a) {
    std::vector<std::string> rest;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        if (f == "--vulkan") a.options.vulkan = true;
        else if ((f == "--threads" || f == "--spare") && i + 1 < argc) {
            char* end = nullptr;
            const long v = std::strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 4096) return false;
            (f == "--threads" ? a.options.threads : a.spare) = static_cast<int>(v);
        } else if (f.rfind("--", 0) == 0) return false;
        else rest.push_back(f);
    }
    if (rest.size() != 2) return false;
    a.package = rest[0];
    a.graph = rest[1];
    return true;
}

// The golden array as a Tensor of 4-byte words (int32 ids keep their bits: ncnn reads them raw).
ncnnport::Tensor as_tensor(const ncnnport::NpyArray& a, const std::string& what) {
    if (a.dtype != "float32" && a.dtype != "int32") throw ncnnport::GraphError(what + ": dtype " + a.dtype);
    ncnnport::Tensor t;
    t.shape = a.shape;
    t.data.resize(static_cast<size_t>(a.size()));
    std::memcpy(t.data.data(), a.data.data(), t.data.size() * sizeof(float));
    return t;
}

// `compact` (dims 3) copied into an owner with `spare` more rows per channel, NaN there, and a
// header over it with the compact h: the layout KvCache::past_k hands to a graph.
ncnn::Mat as_view(const ncnn::Mat& compact, int spare) {
    ncnn::Mat owner(compact.w, compact.h + spare, compact.c, compact.elemsize);
    if (owner.empty()) throw ncnnport::GraphError("view: ncnn could not allocate the owner");
    owner.fill(std::numeric_limits<float>::quiet_NaN());
    for (int q = 0; q < compact.c; ++q)
        std::memcpy(owner.channel(q).data, compact.channel(q).data, size_t(compact.w) * compact.h * compact.elemsize);
    ncnn::Mat view = owner;  // shares data and reference count
    view.h = compact.h;
    return view;
}

// Bitwise comparison of two runs; prints one line per output.
bool same(const ncnnport::Graph& g, const std::vector<ncnnport::Tensor>& a, const std::vector<ncnnport::Tensor>& b) {
    bool ok = a.size() == b.size();
    for (size_t i = 0; ok && i < a.size(); ++i) {
        if (a[i].shape != b[i].shape || a[i].data.size() != b[i].data.size()) {
            std::cout << "output " << g.outputs()[i].name << ": shapes differ\n";
            ok = false;
            break;
        }
        size_t differ = 0;
        double worst = 0.0;
        for (size_t k = 0; k < a[i].data.size(); ++k) {
            if (std::memcmp(&a[i].data[k], &b[i].data[k], sizeof(float)) == 0) continue;
            ++differ;
            const double d = std::fabs(double(a[i].data[k]) - double(b[i].data[k]));
            worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
        }
        std::cout << "output " << g.outputs()[i].name << ": " << differ << " of " << a[i].data.size()
                  << " values differ" << (differ ? ", max |diff| " + std::to_string(worst) : "") << "\n";
        ok = ok && differ == 0;
    }
    return ok;
}

int run(const Args& a) {
    ncnnport::Graph graph(a.package, a.graph, a.options);
    const std::string golden = a.package + "/golden/" + a.graph + ".npz";
    auto arrays = ncnnport::read_npz(golden);
    std::vector<ncnn::Mat> compact, views;
    int viewed = 0;
    for (size_t i = 0; i < graph.inputs().size(); ++i) {
        const std::string key = "case0/in" + std::to_string(i);
        const auto it = arrays.find(key);
        if (it == arrays.end()) throw ncnnport::GraphError(golden + ": no " + key);
        compact.push_back(ncnnport::to_mat(as_tensor(it->second, golden + ": " + key)));
        const bool view = compact.back().dims == 3;
        views.push_back(view ? as_view(compact.back(), a.spare) : compact.back());
        viewed += view;
    }
    if (viewed == 0) throw ncnnport::GraphError("graph " + a.graph + ": no 3-D input to feed as a view");
    const auto want = graph.run(compact);
    const auto got = graph.run(views);
    std::cout << "graph " << a.graph << (a.options.vulkan ? " (vulkan)" : " (cpu)") << ": " << viewed
              << " input(s) fed as views with " << a.spare << " spare rows\n";
    return same(graph, want, got) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    if (!parse(argc, argv, a)) {
        std::cerr << "usage: ncnnport-view-check PACKAGE GRAPH [--vulkan] [--threads N] [--spare ROWS]\n";
        return 2;
    }
    int rc = 2;
    try {
        rc = run(a);
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-view-check: " << e.what() << "\n";
    }
#if NCNN_VULKAN
    ncnn::destroy_gpu_instance();
#endif
    return rc;
}
