#include "ncnnport/seedvr2_graph.h"
#include "ncnnport/ncnn_graph.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>

#include <gpu.h>

namespace ncnnport::seedvr2 {
namespace {

std::vector<BlobSpec> blob_specs(const nlohmann::json& list, const std::string& where) {
    if (!list.is_array()) throw GraphError(where + " is not a list");
    std::vector<BlobSpec> out;
    for (const auto& t : list) {
        if (!t.is_object() || !t.contains("name") || !t.contains("shape") || !t["shape"].is_array())
            throw GraphError(where + ": a tensor lacks name or shape");
        if (t.value("dtype", "float32") != "float32") throw GraphError(where + ": " + t["name"].get<std::string>() + " is not float32");
        BlobSpec b;
        b.name = t["name"].get<std::string>();
        for (const auto& d : t["shape"]) b.dims.push_back(d.is_number() ? std::to_string(d.get<int64_t>()) : d.get<std::string>());
        out.push_back(b);
    }
    return out;
}

bool is_number(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
}

// Axis sizes read off the inputs (runtime/session.py infer_sizes); "name+k" offsets not used here.
void solve_axes(const BlobSpec& spec, const Tensor& t, std::map<std::string, int64_t>* sizes, const std::string& what) {
    if (t.shape.size() != spec.dims.size())
        throw GraphError(what + ": got rank " + std::to_string(t.shape.size()) + " " + shape_text(t.shape) + ", spec rank " +
                         std::to_string(spec.dims.size()));
    for (size_t i = 0; i < spec.dims.size(); ++i) {
        const std::string& d = spec.dims[i];
        if (is_number(d)) {
            if (std::stoll(d) != t.shape[i]) throw GraphError(what + ": got shape " + shape_text(t.shape) + ", axis " + std::to_string(i) + " must be " + d);
        } else if (!sizes->emplace(d, t.shape[i]).second && sizes->at(d) != t.shape[i]) {
            throw GraphError(what + ": axis " + d + " is " + std::to_string(t.shape[i]) + " here but " +
                             std::to_string(sizes->at(d)) + " from an earlier input");
        }
    }
}

}  // namespace

ncnn::Mat to_mat(const Tensor& t, const std::string& what) {
    if (t.shape.size() < 2 || t.shape[0] != 1) throw GraphError(what + ": needs a leading batch axis of 1, got " + shape_text(t.shape));
    std::vector<int> d(t.shape.begin() + 1, t.shape.end());
    ncnn::Mat m;
    switch (d.size()) {
        case 1: m.create(d[0]); break;
        case 2: m.create(d[1], d[0]); break;
        case 3: m.create(d[2], d[1], d[0]); break;
        case 4: m.create(d[3], d[2], d[1], d[0]); break;
        default: throw GraphError(what + ": rank " + std::to_string(t.shape.size()) + " exceeds ncnn's 4 dims + batch");
    }
    if (m.empty()) throw GraphError(what + ": cannot allocate " + shape_text(t.shape));
    const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
    for (int q = 0; q < m.c; ++q) std::memcpy(m.channel(q).data, t.data.data() + q * plane, plane * sizeof(float));
    return m;
}

Tensor from_mat(const ncnn::Mat& m, size_t rank, const std::string& what) {
    std::vector<int64_t> shape{1};
    if (m.dims == 1) shape.insert(shape.end(), {m.w});
    else if (m.dims == 2) shape.insert(shape.end(), {m.h, m.w});
    else if (m.dims == 3) shape.insert(shape.end(), {m.c, m.h, m.w});
    else if (m.dims == 4) shape.insert(shape.end(), {m.c, m.d, m.h, m.w});
    else throw GraphError(what + ": ncnn returned an empty Mat");
    if (m.elemsize != 4 * static_cast<size_t>(m.elempack)) throw GraphError(what + ": ncnn returned a non-fp32 Mat");
    Tensor t;
    ncnn::Mat flat = m;
    if (m.elempack != 1) ncnn::convert_packing(m, flat, 1);
    const size_t plane = static_cast<size_t>(flat.w) * flat.h * flat.d;
    t.data.resize(plane * flat.c);
    for (int q = 0; q < flat.c; ++q) std::memcpy(t.data.data() + q * plane, flat.channel(q).data, plane * sizeof(float));
    while (shape.size() > rank && shape[1] == 1) shape.erase(shape.begin() + 1);
    while (shape.size() < rank) shape.insert(shape.begin() + 1, 1);
    if (shape.size() != rank) throw GraphError(what + ": ncnn returned shape " + shape_text(shape) + " that cannot be rank " + std::to_string(rank));
    t.shape = shape;
    return t;
}

Graph::Graph(const std::filesystem::path& package, const std::string& name, const RunOptions& options) : name_(name) {
    const auto spec_path = package / "specs" / (name + ".spec.json");
    const auto param = package / "ncnn" / (name + ".ncnn.param");
    const auto bin = package / "ncnn" / (name + ".ncnn.bin");
    for (const auto& p : {spec_path, param, bin})
        if (!std::filesystem::is_regular_file(p)) throw GraphError("module " + name + ": missing " + p.string());
    std::ifstream in(spec_path);
    const auto spec = nlohmann::json::parse(in, nullptr, false);
    if (spec.is_discarded() || !spec.is_object()) throw GraphError(spec_path.string() + ": not a JSON object");
    inputs_ = blob_specs(spec.value("inputs", nlohmann::json()), spec_path.string() + " inputs");
    outputs_ = blob_specs(spec.value("outputs", nlohmann::json()), spec_path.string() + " outputs");
    net_ = std::make_unique<ncnn::Net>();
    try {  // set before load_param
        net_->opt = ncnnport::precision_options(options.threads, options.vulkan, options.precision);
    } catch (const std::invalid_argument& e) {
        throw GraphError("module " + name + ": " + e.what());
    }
#if NCNN_VULKAN
    if (options.vulkan) {
        if (ncnn::get_gpu_count() == 0) throw GraphError("module " + name + ": Vulkan requested but ncnn sees no GPU");
        net_->set_vulkan_device(0);
    }
#else
    if (options.vulkan) throw GraphError("--vulkan: this executable was built without Vulkan (make cpp VULKAN=1)");
#endif
    ncnnport::note_graph_option(net_->opt);
    if (net_->load_param(param.string().c_str()) != 0) throw GraphError("module " + name + ": ncnn could not load param " + param.string());
    if (net_->load_model(bin.string().c_str()) != 0) throw GraphError("module " + name + ": ncnn could not load weights " + bin.string());
    std::vector<std::string> blobs;
    for (const char* b : net_->input_names()) blobs.emplace_back(b);
    for (const char* b : net_->output_names()) blobs.emplace_back(b);
    for (const auto* list : {&inputs_, &outputs_})
        for (const auto& t : *list)
            if (std::find(blobs.begin(), blobs.end(), t.name) == blobs.end())
                throw GraphError("module " + name + ": blob '" + t.name + "' not in " + param.string());
}

std::vector<Tensor> Graph::run(const std::map<std::string, const Tensor*>& named) {
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, int64_t> sizes;
    ncnn::Extractor ex = net_->create_extractor();
    for (const auto& spec : inputs_) {
        const std::string what = "module " + name_ + ", input " + spec.name;
        const auto it = named.find(spec.name);
        if (it == named.end() || !it->second) throw GraphError(what + ": not provided by the host loop");
        solve_axes(spec, *it->second, &sizes, what);
        if (ex.input(spec.name.c_str(), to_mat(*it->second, what)) != 0) throw GraphError(what + ": rejected by ncnn");
    }
    std::vector<Tensor> outs;
    for (const auto& spec : outputs_) {
        const std::string what = "module " + name_ + ", output " + spec.name;
        ncnn::Mat m;
        const int rc = ex.extract(spec.name.c_str(), m);
        if (rc != 0) throw GraphError(what + ": extract returned " + std::to_string(rc));
        Tensor t = from_mat(m, spec.dims.size(), what);
        for (size_t i = 0; i < spec.dims.size(); ++i) {
            const std::string& d = spec.dims[i];
            const int64_t want = is_number(d) ? std::stoll(d) : (sizes.count(d) ? sizes[d] : -1);
            if (want >= 0 && want != t.shape[i]) throw GraphError(what + ": shape " + shape_text(t.shape) + " does not fit the spec");
        }
        outs.push_back(std::move(t));
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return outs;
}

}  // namespace ncnnport::seedvr2
