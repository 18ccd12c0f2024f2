#include "ncnnport/ncnn_graph.h"

#include "ncnnport/huge_pages.h"

#include <gpu.h>  // ncnn (get_gpu_count under NCNN_VULKAN)

#include "ncnnport/gemv_layer.h"
#include "ncnnport/gemv_prefetch.h"
#include "ncnnport/stream_times.h"
#include "ncnnport/huge_page_allocator.h"
#include "ncnnport/matmul_layer.h"
#include "ncnnport/memory_data_layer.h"
#include "ncnnport/int8_gemv_layer.h"
#include "ncnnport/kernel_weight_allocator.h"
#include "ncnnport/precision.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>

namespace ncnnport {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
    std::ostringstream s;
    s << "(";
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << (shape.size() == 1 ? ",)" : ")");
    return s.str();
}

std::string spec_text(const TensorSpec& t) {
    std::ostringstream s;
    s << "[";
    for (size_t i = 0; i < t.rank(); ++i) {
        s << (i ? ", " : "");
        if (t.sizes[i] < 0) s << t.axes[i]; else s << t.sizes[i];
    }
    s << "]";
    return s.str();
}

// Binds `got` to the spec's axes; false when a fixed size or an already bound symbol differs.
bool bind_sizes(const TensorSpec& t, const std::vector<int64_t>& got, std::map<std::string, int64_t>& sizes) {
    if (got.size() != t.rank()) return false;
    for (size_t i = 0; i < t.rank(); ++i) {
        if (t.sizes[i] >= 0) {
            if (got[i] != t.sizes[i]) return false;
            continue;
        }
        const auto it = sizes.find(t.axes[i]);
        if (it == sizes.end()) sizes[t.axes[i]] = got[i];
        else if (it->second != got[i]) return false;
    }
    return true;
}

}  // namespace

std::vector<TensorSpec> read_tensor_specs(const JsonFile& spec, const std::string& field) {
    const auto& list = spec.at(field);
    if (!list.is_array() || list.empty()) spec.fail(field, "is not a non-empty list");
    std::vector<TensorSpec> out;
    for (size_t i = 0; i < list.size(); ++i) {
        const std::string where = field + "[" + std::to_string(i) + "]";
        const auto& item = list[i];
        if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("shape")
            || !item["shape"].is_array() || item["shape"].size() < 2 || item["shape"].size() > 5)
            spec.fail(where, "needs a string 'name' and a 'shape' of rank 2..5");
        TensorSpec t;
        t.name = item["name"].get<std::string>();
        for (const auto& d : item["shape"]) {
            if (d.is_number_integer() && d.get<int64_t>() > 0) {
                t.sizes.push_back(d.get<int64_t>());
                t.axes.emplace_back();
            } else if (d.is_string() && !d.get<std::string>().empty()) {
                t.sizes.push_back(-1);
                t.axes.push_back(d.get<std::string>());
            } else {
                spec.fail(where + ".shape", "holds an axis that is neither a positive size nor a name");
            }
        }
        if (t.sizes[0] != 1) spec.fail(where + ".shape", "must start with a batch axis of 1");
        const std::string dtype = item.value("dtype", std::string("float32"));
        if (dtype != "float32" && dtype != "int32") spec.fail(where + ".dtype", "is '" + dtype + "', not float32 or int32");
        t.int32 = dtype == "int32";
        out.push_back(std::move(t));
    }
    return out;
}

std::vector<int64_t> mat_shape(const ncnn::Mat& m) {
    switch (m.dims) {
        case 1: return {m.w};
        case 2: return {m.h, m.w};
        case 3: return {m.c, m.h, m.w};
        case 4: return {m.c, m.d, m.h, m.w};
        default: return {};
    }
}

ncnn::Mat to_mat(const Tensor& t) {
    const auto& s = t.shape;
    if (s.size() < 2 || s.size() > 5 || s[0] != 1)
        throw GraphError("to_mat: shape " + shape_text(s) + " needs a batch axis of 1 and rank 2..5");
    ncnn::Mat m;
    if (s.size() == 2) m.create(static_cast<int>(s[1]));
    else if (s.size() == 3) m.create(static_cast<int>(s[2]), static_cast<int>(s[1]));
    else if (s.size() == 4) m.create(static_cast<int>(s[3]), static_cast<int>(s[2]), static_cast<int>(s[1]));
    else m.create(static_cast<int>(s[4]), static_cast<int>(s[3]), static_cast<int>(s[2]), static_cast<int>(s[1]));
    if (m.empty()) throw GraphError("to_mat: ncnn could not allocate " + shape_text(s));
    const size_t per_channel = static_cast<size_t>(m.w) * m.h * m.d;
    if (per_channel * m.c != t.data.size())
        throw GraphError("to_mat: " + std::to_string(t.data.size()) + " values for shape " + shape_text(s));
    for (int c = 0; c < m.c; ++c)
        std::memcpy(m.channel(c).data, t.data.data() + c * per_channel, per_channel * sizeof(float));
    return m;
}

ncnn::Mat ids_mat(const std::vector<int32_t>& ids) {
    ncnn::Mat m(static_cast<int>(ids.size()), static_cast<size_t>(4u));
    if (m.empty()) throw GraphError("ids_mat: ncnn could not allocate " + std::to_string(ids.size()) + " ids");
    std::memcpy(m.data, ids.data(), ids.size() * sizeof(int32_t));
    return m;
}

ncnn::Option fp32_options(int threads, bool vulkan) {
    ncnn::Option opt;
    opt.num_threads = threads;
    opt.use_vulkan_compute = vulkan;
    opt.use_fp16_storage = false;
    opt.use_fp16_packed = false;
    opt.use_fp16_arithmetic = false;
    opt.use_bf16_storage = false;
    opt.use_packing_layout = true;
    // CPU nets allocate each call's blobs from the heap and free them when the call ends, instead
    // of ncnn's default per-Net pool. Why: that pool keeps every block a Net ever allocated until
    // the Net is destroyed and hands any larger free block to a smaller request, so a loop of
    // graphs holds the sum of their peaks, and more. Youtu-VL real widths, 4 layers, fp16-storage,
    // one EPYC thread: a 3008-token prompt was killed for memory past 24 GB with the pools and
    // peaked at 10.6 GB without; decode speed did not move beyond the noise (runtime/cpp/README.md,
    // "Blob memory").
    opt.use_local_pool_allocator = vulkan;
    return opt;
}

ncnn::Option precision_options(int threads, bool vulkan, const std::string& precision) {
    const CpuPrecision& p = checked_precision(precision, vulkan);
    ncnn::Option opt = fp32_options(threads, vulkan);
    opt.use_fp16_storage = p.fp16_storage;
    opt.use_fp16_packed = p.fp16_packed;
    opt.use_fp16_arithmetic = p.fp16_arithmetic;
    opt.use_bf16_storage = p.bf16_storage;
    return opt;
}

namespace {
std::mutex g_options_mutex;
std::vector<nlohmann::json> g_option_flags;  // the distinct flag sets of the nets opened so far
}  // namespace

void note_graph_option(const ncnn::Option& opt) {
    const nlohmann::json flags = {{"fp16_storage", opt.use_fp16_storage}, {"fp16_packed", opt.use_fp16_packed},
                                  {"fp16_arithmetic", opt.use_fp16_arithmetic}, {"bf16_storage", opt.use_bf16_storage}};
    std::lock_guard<std::mutex> lock(g_options_mutex);
    if (std::find(g_option_flags.begin(), g_option_flags.end(), flags) == g_option_flags.end())
        g_option_flags.push_back(flags);
}

nlohmann::json precision_record(const std::string& precision) {
    std::lock_guard<std::mutex> lock(g_options_mutex);
    const nlohmann::json flags = g_option_flags.empty() ? nlohmann::json(nullptr)
                                 : g_option_flags.size() == 1 ? g_option_flags.front()
                                                              : nlohmann::json(g_option_flags);
    return {{"precision", precision}, {"precision_flags", flags}};
}

bool gemv_active(const GraphOptions& options) {
    return !options.vulkan && options.gemv != GemvChoice::Ncnn && gemv_layer_supported();
}

bool matmul_active(const GraphOptions& options) {
    return !options.vulkan && options.matmul_kernel && matmul_layer_supported();
}

bool fp16_cache_inputs_active(const GraphOptions& options) {
    return matmul_active(options) && matmul_fp16_cache_supported()
           && !checked_precision(options.precision, options.vulkan).bf16_storage;
}

bool int8_gemv_active(const GraphOptions& options) {
    return !options.vulkan && options.int8_kernel && int8_gemv_layer_supported();
}

bool register_gemv_for(ncnn::Net& net, const GraphOptions& options) {
    if (!options.vulkan) register_memory_data_layer(net);
    if (matmul_active(options)) register_matmul_layer(net);
    if (int8_gemv_active(options)) register_int8_gemv_layer(net);
    return gemv_active(options) && register_gemv_layer(net);
}

namespace {
nlohmann::json prefetch_json(const GemvPrefetchChoice& choice) {
    return prefetch_report_json(choice.report());
}
}  // namespace

nlohmann::json gemv_prefetch_json(bool fp16) { return prefetch_json(gemv_prefetch_choice(fp16)); }
nlohmann::json attention_prefetch_json(bool scores) { return prefetch_json(attention_prefetch_choice(scores)); }
nlohmann::json int8_gemv_prefetch_json() { return prefetch_json(int8_gemv_prefetch_choice()); }

nlohmann::json gemv_json(const GraphOptions& options) {
    return {{"gemv", gemv_layer_label(gemv_active(options))}, {"gemv_calls", gemv_layer_calls()},
            {"gemv_ncnn_avx512", gemv_builtin_avx512()},
            {"matmul", matmul_layer_label(matmul_active(options))}, {"matmul_calls", matmul_layer_calls()},
            // whether products of more than kStreamMaxRows rows (MLA's 32) run the AVX-512 kernels
            {"matmul_many_rows", matmul_active(options) && matmul_many_rows_supported()},
            {"memory_data_shares", memory_data_shares()},
            {"int8_gemv", int8_gemv_layer_label(int8_gemv_active(options))},
            {"int8_gemv_calls", int8_gemv_layer_calls()}, {"kernel_weights_huge_bytes", kernel_weight_huge_bytes()},
            {"gemv_prefetch", {{"fp32", gemv_prefetch_json(false)}, {"fp16", gemv_prefetch_json(true)},
                               {"int8", int8_gemv_prefetch_json()}}},
            {"gemv_prefetch_distance", {{"fp32", prefetch_report_json(gemv_prefetch_distance_choice(false).report())},
                                        {"fp16", prefetch_report_json(gemv_prefetch_distance_choice(true).report())},
                                        {"int8", prefetch_report_json(int8_gemv_prefetch_distance_choice().report())}}},
            {"weight_streams", {{"fp32", gemv_stream_times(false).json()}, {"fp16", gemv_stream_times(true).json()},
                                {"int8", int8_gemv_stream_times().json()}}},
            // the int8 AVX2 copy's choice between one stream and kAvx2Streams side by side
            {"int8_gemv_streams", prefetch_json(int8_gemv_streams_choice())},
            // the one-row kernel's narrow layout (AVX2-only CPUs): one block at a time or 4 side by side
            {"gemv_streams", {{"fp32", prefetch_json(gemv_streams_choice(false))}, {"fp16", prefetch_json(gemv_streams_choice(true))}}},
            {"attention_prefetch", {{"scores", attention_prefetch_json(true)}, {"weighted", attention_prefetch_json(false)}}},
            {"attention_prefetch_distance", {{"scores", prefetch_report_json(attention_prefetch_distance_choice(true).report())},
                                             {"weighted", prefetch_report_json(attention_prefetch_distance_choice(false).report())}}},
            {"kv_cache_huge_peak_bytes", huge_page_allocator_peak_bytes()}};
}

Graph::Graph(const std::filesystem::path& package, const std::string& name, const GraphOptions& options,
             const std::string& variant)
    : name_(variant.empty() ? name : name + "." + variant), net_(std::make_unique<ncnn::Net>()),
      package_(package), base_name_(name), variant_(variant), options_(options) {
    const JsonFile spec = JsonFile::load(package / "specs" / (name + ".spec.json"));
    inputs_ = read_tensor_specs(spec, "inputs");
    outputs_ = read_tensor_specs(spec, "outputs");
    const auto param = package / "ncnn" / (name_ + ".ncnn.param");
    const auto weights = package / "ncnn" / (name + ".ncnn.bin");
    for (const auto& p : {param, weights})
        if (!std::filesystem::is_regular_file(p)) throw PackageError(p.string() + ": missing (graph " + name_ + ")");
    // contract.ModuleSpec.concurrent_calls: independent calls the pipeline makes at once. Not on
    // Vulkan (one queue); --serial-windows keeps one call at a time on all threads.
    int concurrent = 1;
    if (spec.has("concurrent_calls") && options.concurrent_calls && !options.vulkan) {
        const int64_t k = spec.integer("concurrent_calls");
        if (k < 1 || k > 4096) spec.fail("concurrent_calls", "must be 1..4096, got " + std::to_string(k));
        concurrent = static_cast<int>(k);
    }
    try {
        split_ = split_threads(options.threads, concurrent);
        net_->opt = precision_options(split_.threads_each, options.vulkan, options.precision);
    } catch (const std::invalid_argument& e) {
        throw GraphError("graph " + name_ + ": " + e.what());
    }
#if NCNN_VULKAN
    if (options.vulkan) {
        if (ncnn::get_gpu_count() == 0) throw GraphError("graph " + name + ": --vulkan but ncnn sees no GPU");
        net_->set_vulkan_device(0);
    }
#else
    if (options.vulkan) throw GraphError("--vulkan: this executable's ncnn has no Vulkan (build with make cpp VULKAN=1)");
#endif
    // A split graph loads on first use (ensure_loaded): a run whose calls all come alone (an
    // image of one window) then holds only solo()'s net, not this one's weights too.
    if (split_.workers < 2) load();
}

void Graph::load() const {
    const auto param = package_ / "ncnn" / (name_ + ".ncnn.param");
    const auto weights = package_ / "ncnn" / (base_name_ + ".ncnn.bin");
    gemv_ = register_gemv_for(*net_, options_);
    note_graph_option(net_->opt);
    if (net_->load_param(param.string().c_str()) != 0) throw PackageError(param.string() + ": ncnn could not load it");
    if (net_->load_model(weights.string().c_str()) != 0) throw PackageError(weights.string() + ": ncnn could not load it");
    if (options_.huge_pages && !options_.vulkan) back_large_mappings_with_huge_pages();
    // Outputs are checked by extract's return code at run time (an output blob may also feed
    // a layer, so it need not be among ncnn's output_names).
    for (const auto& t : inputs_) {
        bool listed = false;
        for (const char* b : net_->input_names()) listed = listed || t.name == b;
        if (!listed) throw PackageError(param.string() + ": no input blob '" + t.name + "' (named by the spec)");
    }
    fp16_cache_inputs_.clear();
    if (fp16_cache_inputs_active(options_)) {
        const auto& blobs = net_->blobs();
        const auto& layers = net_->layers();
        for (size_t i = 0; i < blobs.size(); ++i) {
            const int c = blobs[i].consumer;
            if (blobs[i].producer < 0 || c < 0) continue;
            const ncnn::Layer* producer = layers[blobs[i].producer];
            const ncnn::Layer* consumer = layers[c];
            if (producer->type == "Input" && consumer->type == "MatMul" && consumer->bottoms.size() == 2
                && consumer->bottoms[1] == static_cast<int>(i))
                fp16_cache_inputs_.push_back(blobs[i].name);
        }
    }
    loaded_ = true;
}

void Graph::ensure_loaded() const {
    if (loaded_) return;
    const std::lock_guard<std::mutex> lock(load_mutex_);
    if (!loaded_) load();
}

Graph::~Graph() = default;

void Graph::bind_input(const TensorSpec& t, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const {
    if (m.empty()) throw GraphError("graph " + name_ + ", input " + t.name + ": empty Mat");
    const bool fp16_ok = m.elemsize == 2 && m.dims == 3
                         && std::find(fp16_cache_inputs_.begin(), fp16_cache_inputs_.end(), t.name) != fp16_cache_inputs_.end();
    if ((m.elemsize != 4 && !fp16_ok) || m.elempack != 1)
        throw GraphError("graph " + name_ + ", input " + t.name + ": Mat of " + std::to_string(m.elemsize)
                         + "-byte elements, pack " + std::to_string(m.elempack) + " (want 4-byte, pack 1"
                         + (m.elemsize == 2 ? "; 2-byte rows only where ncnnport's decode MatMul reads them" : "") + ")");
    std::vector<int64_t> got = mat_shape(m);
    got.insert(got.begin(), 1);
    if (!bind_sizes(t, got, sizes))
        throw GraphError("graph " + name_ + ", input " + t.name + ": shape " + shape_text(got) + " does not fit spec "
                         + spec_text(t));
}

std::vector<int64_t> Graph::fit_output_shape(const TensorSpec& t, std::vector<int64_t> shape,
                                             std::map<std::string, int64_t>& sizes) const {
    // ncnn may add or drop unit axes (e.g. (1,1,S,V) after a Linear): only those are adjusted,
    // as runtime/mats.from_mat does.
    const std::vector<int64_t> got = shape;
    shape.insert(shape.begin(), 1);
    while (shape.size() > t.rank() && shape[1] == 1) shape.erase(shape.begin() + 1);
    while (shape.size() < t.rank()) shape.insert(shape.begin() + 1, 1);
    if (!bind_sizes(t, shape, sizes))
        throw GraphError("graph " + name_ + ", output " + t.name + ": shape " + shape_text(got) + " does not fit spec "
                         + spec_text(t));
    return shape;
}

std::vector<int64_t> Graph::check_output(const TensorSpec& t, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const {
    const std::string what = "graph " + name_ + ", output " + t.name;
    if (m.empty()) throw GraphError(what + ": ncnn returned an empty Mat");
    if (m.elemsize != 4 || m.elempack != 1)
        throw GraphError(what + ": Mat of " + std::to_string(m.elemsize) + "-byte elements, pack "
                         + std::to_string(m.elempack));
    return fit_output_shape(t, mat_shape(m), sizes);
}

Tensor Graph::fetch_output(const TensorSpec& t, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const {
    Tensor out;
    out.shape = check_output(t, m, sizes);
    const size_t per_channel = static_cast<size_t>(m.w) * m.h * m.d;
    // copied, never zero-filled first (resize would write every float twice: a decode step's
    // 151936 logits are 608 KB)
    out.data.reserve(per_channel * m.c);
    for (int c = 0; c < m.c; ++c) {
        const float* p = m.channel(c);
        out.data.insert(out.data.end(), p, p + per_channel);
    }
    return out;
}

namespace {
// A cache view (kv_cache.h) keeps its owner's channel step. ncnn's Vulkan upload
// (VkCompute::record_upload, 1.0.20261020) sizes the staging buffer from the dims but copies
// cstep * c elements of the source: a view with a larger step writes past the staging buffer
// (heap corruption, seen on lavapipe). The upload copies anyway, so on Vulkan such an input is
// first cloned into a compact Mat; on the CPU it is read in place.
bool compact(const ncnn::Mat& m) {
    const size_t plane = static_cast<size_t>(m.w) * m.h * m.d * m.elemsize;
    return m.dims < 3 || m.cstep == ((plane + 15) & ~static_cast<size_t>(15)) / m.elemsize;
}
}  // namespace

std::vector<Tensor> Graph::run(const std::vector<ncnn::Mat>& inputs) {
    double ncnn_s = 0.0;
    const double streams_before = weight_stream_seconds();
    std::vector<Tensor> outs = run_call(inputs, &ncnn_s);
    stream_seconds_ += weight_stream_seconds() - streams_before;
    seconds_ += ncnn_s;
    return outs;
}

std::vector<std::vector<Tensor>> Graph::run_each(const std::vector<std::vector<ncnn::Mat>>& calls) {
    std::vector<std::vector<Tensor>> outs(calls.size());
    if (split_.workers < 2) {
        for (size_t i = 0; i < calls.size(); ++i) outs[i] = run(calls[i]);
        return outs;
    }
    // the split net keeps its load-time share for every call: one left alone goes to the net of
    // all the threads (a 224x224 image's one window, device Xeon, 16 threads: 10 ms on the split
    // graph's 4, 6 ms on 16)
    const bool lone = calls.size() % static_cast<size_t>(split_.workers) == 1;
    const size_t together = calls.size() - (lone ? 1 : 0);
    // both nets opened before the clock starts: seconds() is the graphs' own time, not loading
    if (together > 0) ensure_loaded();
    Graph* alone = lone ? &solo() : nullptr;
    if (together > 0 && !workers_) workers_ = std::make_unique<CallWorkers>(split_.workers);
    // the calls overlap, so the batch counts by its wall time (the output copies included)
    const auto t0 = std::chrono::steady_clock::now();
    const double streams_before = weight_stream_seconds();
    if (together > 0) workers_->run(together, [&](size_t i) { outs[i] = run_call(calls[i]); });
    if (alone) outs.back() = alone->run_call(calls.back());
    stream_seconds_ += weight_stream_seconds() - streams_before;
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return outs;
}

Graph& Graph::solo() {
    if (split_.threads_each >= options_.threads) return *this;
    if (!solo_) {
        GraphOptions all = options_;
        all.concurrent_calls = false;  // loaded for all the threads, one call at a time
        solo_ = std::make_unique<Graph>(package_, base_name_, all, variant_);
    }
    return *solo_;
}

std::vector<ncnn::Mat> Graph::run_mats(const std::vector<ncnn::Mat>& inputs) {
    std::map<std::string, int64_t> sizes;
    double ncnn_s = 0.0;
    const double streams_before = weight_stream_seconds();
    std::vector<ncnn::Mat> mats = extract_call(inputs, sizes, &ncnn_s);
    stream_seconds_ += weight_stream_seconds() - streams_before;
    seconds_ += ncnn_s;
    for (size_t i = 0; i < outputs_.size(); ++i) check_output(outputs_[i], mats[i], sizes);
    return mats;
}

std::vector<Tensor> Graph::run_call(const std::vector<ncnn::Mat>& inputs, double* ncnn_s) const {
    std::map<std::string, int64_t> sizes;
    const std::vector<ncnn::Mat> mats = extract_call(inputs, sizes, ncnn_s);
    std::vector<Tensor> outs;
    for (size_t i = 0; i < outputs_.size(); ++i) outs.push_back(fetch_output(outputs_[i], mats[i], sizes));
    return outs;
}

std::vector<ncnn::Mat> Graph::extract_call(const std::vector<ncnn::Mat>& inputs, std::map<std::string, int64_t>& sizes,
                                           double* ncnn_s) const {
    ensure_loaded();
    if (inputs.size() != inputs_.size())
        throw GraphError("graph " + name_ + ": " + std::to_string(inputs.size()) + " inputs, spec has "
                         + std::to_string(inputs_.size()));
    for (size_t i = 0; i < inputs.size(); ++i) bind_input(inputs_[i], inputs[i], sizes);
    const auto t0 = std::chrono::steady_clock::now();
    ncnn::Extractor ex = net_->create_extractor();
    const bool upload = net_->opt.use_vulkan_compute;
    for (size_t i = 0; i < inputs.size(); ++i)
        if (ex.input(inputs_[i].name.c_str(), upload && !compact(inputs[i]) ? inputs[i].clone() : inputs[i]) != 0)
            throw GraphError("graph " + name_ + ": input blob '" + inputs_[i].name + "' rejected");
    std::vector<ncnn::Mat> mats(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
        const int rc = ex.extract(outputs_[i].name.c_str(), mats[i]);
        if (rc != 0)
            throw GraphError("graph " + name_ + ": extract('" + outputs_[i].name + "') returned " + std::to_string(rc));
    }
    if (ncnn_s) *ncnn_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return mats;
}

namespace {
// `what` summed over the graphs whose name starts with one of `prefixes`.
double sum_over_graphs(const std::map<std::string, std::unique_ptr<Graph>>& graphs,
                       const std::vector<std::string>& prefixes, double (Graph::*what)() const) {
    double s = 0.0;
    for (const auto& [name, g] : graphs)
        for (const auto& p : prefixes)
            if (name.rfind(p, 0) == 0) {
                s += ((*g).*what)();
                break;
            }
    return s;
}
}  // namespace

double graph_seconds_of(const std::map<std::string, std::unique_ptr<Graph>>& graphs,
                        const std::vector<std::string>& prefixes) {
    return sum_over_graphs(graphs, prefixes, &Graph::seconds);
}

double graph_stream_seconds_of(const std::map<std::string, std::unique_ptr<Graph>>& graphs,
                               const std::vector<std::string>& prefixes) {
    return sum_over_graphs(graphs, prefixes, &Graph::stream_seconds);
}

}  // namespace ncnnport

#if NCNN_VULKAN
namespace ncnnport {

std::vector<int64_t> vkmat_shape(const ncnn::VkMat& m) {
    const int p = m.elempack;  // ncnn packs the outermost axis
    switch (m.dims) {
        case 1: return {static_cast<int64_t>(m.w) * p};
        case 2: return {static_cast<int64_t>(m.h) * p, m.w};
        case 3: return {static_cast<int64_t>(m.c) * p, m.h, m.w};
        case 4: return {static_cast<int64_t>(m.c) * p, m.d, m.h, m.w};
        default: return {};
    }
}

const ncnn::VulkanDevice* Graph::vulkan_device() const {
    if (!net_->opt.use_vulkan_compute) throw GraphError("graph " + name_ + ": opened without Vulkan");
    return net_->vulkan_device();
}

GpuArena::GpuArena(const ncnn::VulkanDevice* vkdev)
    : blob_(std::make_unique<ncnn::VkBlobAllocator>(vkdev)),
      workspace_(std::make_unique<ncnn::VkBlobAllocator>(vkdev)),
      staging_(std::make_unique<ncnn::VkStagingAllocator>(vkdev)),
      opt_(fp32_options(1, true)) {
    opt_.blob_vkallocator = blob_.get();
    opt_.workspace_vkallocator = workspace_.get();
    opt_.staging_vkallocator = staging_.get();
}

GpuArena::~GpuArena() = default;

std::vector<ncnn::VkMat> Graph::record(ncnn::VkCompute& cmd, const std::vector<GpuInput>& inputs, const GpuArena& arena) {
    if (!net_->opt.use_vulkan_compute) throw GraphError("graph " + name_ + ": record() needs a graph opened with Vulkan");
    if (inputs.size() != inputs_.size())
        throw GraphError("graph " + name_ + ": " + std::to_string(inputs.size()) + " inputs, spec has "
                         + std::to_string(inputs_.size()));
    std::map<std::string, int64_t> sizes;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto& in = inputs[i];
        if (in.gpu.empty()) {
            bind_input(inputs_[i], in.host, sizes);
            continue;
        }
        const TensorSpec& t = inputs_[i];
        if (!in.host.empty()) throw GraphError("graph " + name_ + ", input " + t.name + ": both a host and a GPU blob");
        if (in.gpu.elemsize != 4u * in.gpu.elempack)
            throw GraphError("graph " + name_ + ", input " + t.name + ": GPU blob of " + std::to_string(in.gpu.elemsize)
                             + "-byte elements, pack " + std::to_string(in.gpu.elempack) + " (want float32)");
        std::vector<int64_t> got = vkmat_shape(in.gpu);
        got.insert(got.begin(), 1);
        if (!bind_sizes(t, got, sizes))
            throw GraphError("graph " + name_ + ", input " + t.name + ": GPU shape " + shape_text(got)
                             + " does not fit spec " + spec_text(t));
    }
    const auto t0 = std::chrono::steady_clock::now();
    ncnn::Extractor ex = net_->create_extractor();
    ex.set_blob_vkallocator(arena.options().blob_vkallocator);
    ex.set_workspace_vkallocator(arena.options().workspace_vkallocator);
    ex.set_staging_vkallocator(arena.options().staging_vkallocator);
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto& in = inputs[i];
        // a host view with a foreign channel step is cloned first (see compact() above)
        const int rc = in.gpu.empty() ? ex.input(inputs_[i].name.c_str(), compact(in.host) ? in.host : in.host.clone())
                                      : ex.input(inputs_[i].name.c_str(), in.gpu);
        if (rc != 0) throw GraphError("graph " + name_ + ": input blob '" + inputs_[i].name + "' rejected");
    }
    std::vector<ncnn::VkMat> outs(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
        const int rc = ex.extract(outputs_[i].name.c_str(), outs[i], cmd);
        if (rc != 0 || outs[i].empty())
            throw GraphError("graph " + name_ + ": extract('" + outputs_[i].name + "') on the GPU returned "
                             + std::to_string(rc));
        if (outs[i].elemsize != 4u * outs[i].elempack)
            throw GraphError("graph " + name_ + ", output " + outputs_[i].name + ": GPU blob is not float32");
        fit_output_shape(outputs_[i], vkmat_shape(outs[i]), sizes);
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return outs;
}

Tensor Graph::host_output(size_t index, const ncnn::Mat& m) const {
    std::map<std::string, int64_t> sizes;
    if (m.elempack == 1) return fetch_output(outputs_.at(index), m, sizes);
    // VkCompute::record_download keeps the device's packing; unpack as Extractor::extract does
    ncnn::Mat unpacked;
    ncnn::convert_packing(m, unpacked, 1, net_->opt);
    return fetch_output(outputs_.at(index), unpacked, sizes);
}

}  // namespace ncnnport
#endif
