// One converted graph of a package, run through ncnn with the checks the Python NcnnModule does.
//
// Why: blob names, ranks and symbolic sizes come from the graph's spec (specs/<name>.spec.json),
// never from the executable, so a package whose graph was re-exported with other names or
// shapes fails in one line naming the graph and blob instead of feeding ncnn a wrong Mat
// (ncnn itself does not check shapes and may read out of bounds). Every ncnn return code is
// checked. Inputs are ncnn Mats without the batch axis (as ncnn's Python binding with
// batch_index=0 makes them); outputs come back as dense float32 tensors in the spec's rank.
#pragma once

#include <net.h>  // ncnn
#include <nlohmann/json.hpp>
#include "ncnnport/concurrent_calls.h"
#include "ncnnport/gemv_choice.h"
#if NCNN_VULKAN
#include <command.h>  // ncnn::VkCompute
#endif

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ncnnport/model_json.h"

namespace ncnnport {

// An ncnn call failed or a tensor does not fit its spec; the message names graph and blob.
class GraphError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct GraphOptions {
    int threads = 1;
    bool vulkan = false;  // needs ncnn built with NCNN_VULKAN (make cpp VULKAN=1)
    GemvChoice gemv = GemvChoice::Auto;
    // A CPU precision of precision.h (--precision): its ncnn flags on every graph. Checked when a
    // graph opens (a name the runtime does not run, or a reduced one with vulkan, is refused).
    std::string precision = "fp32";
    // CPU nets: back the loaded weights with huge pages once loaded (huge_pages.h: faster decode,
    // slower load), --huge-pages. Vulkan nets keep their weights on the device: never touched.
    bool huge_pages = false;
    // CPU nets: decode attention's MatMuls by ncnnport's kernel (matmul_layer.h) where the CPU
    // runs it; false (--ncnn-matmul) keeps ncnn's MatMul, for comparisons.
    bool matmul_kernel = true;
    // CPU nets: one-row products of int8-weights Gemms (package-int8w) by ncnnport's kernel
    // (int8_gemv_layer.h) where the CPU runs it; false (--ncnn-int8) keeps ncnn's Gemm.
    bool int8_kernel = true;
    // Graphs whose spec sets concurrent_calls (Youtu-VL's window segments) load for a share of
    // the threads and run_each runs that many calls at once (concurrent_calls.h); false
    // (--serial-windows) loads every graph for all threads, one call at a time, for comparisons.
    bool concurrent_calls = true;
};

// True when graphs opened with `options` get the gemv overwrite: a CPU net, a CPU that runs the
// kernel, and GemvChoice Auto or Kernel (Ncnn keeps ncnn's InnerProduct).
bool gemv_active(const GraphOptions& options);
// Registers the gemv overwrite on `net` (before load_param) when gemv_active(options), and the
// MatMul overwrite when matmul_active(options) and the int8 Gemm overwrite when
// int8_gemv_active(options), and on every CPU net the copy-free MemoryData (memory_data_layer.h);
// true when the gemv overwrite was registered.
bool register_gemv_for(ncnn::Net& net, const GraphOptions& options);
// True when graphs opened with `options` get the MatMul overwrite: a CPU net, a CPU that runs the
// kernel, and options.matmul_kernel.
bool matmul_active(const GraphOptions& options);
// True when graphs opened with `options` may take fp16 K/V rows as 2-byte inputs
// (kv_cache.h KvRows::Fp16): matmul_active, a CPU with F16C (matmul_fp16_cache_supported), and a
// precision without bf16 storage. Why the last: under bf16 storage ncnn's convert_layout casts
// every 16-bit blob entering a layer without bf16 support (x86 MatMul has none) from bf16 to
// fp32, so fp16 bits would be read as bf16, silently (a bf16 run over an int8-weights package,
// whose rows are fp16, parted from the same run with 4-byte rows at token 1). There the rows are
// kept as fp16 values in 4 bytes (KvRows::Fp16Values).
bool fp16_cache_inputs_active(const GraphOptions& options);
// True when graphs opened with `options` get the int8 Gemm overwrite: a CPU net, a CPU that runs
// the kernel (AVX-512 VNNI), and options.int8_kernel.
bool int8_gemv_active(const GraphOptions& options);
// What a run reports: "ncnnport-avx512", "ncnnport-avx2" or "ncnn" (gemv_layer_label of
// gemv_active), the one-row products the overwrite computed so far ("gemv_calls": 0 with a
// ncnnport label means it never ran), and whether ncnn's own InnerProduct runs its AVX-512 copy
// here ("gemv_ncnn_avx512": what --ncnn-gemv runs);
// likewise "matmul" ("ncnnport-avx2" or "ncnn", matmul_active) and "matmul_calls", and "int8_gemv"
// ("ncnnport-avx512vnni" or "ncnn", int8_gemv_active) and "int8_gemv_calls", the MemoryData
// outputs handed on without a copy ("memory_data_shares", memory_data_layer.h), the bytes of the
// overwrites' own weight copies in the huge-page arena ("kernel_weights_huge_bytes",
// kernel_weight_allocator.h), and the gemv kernel's prefetch choice per weight width
// ("gemv_prefetch": {"fp32", "fp16"} each with its state and sampled medians, gemv_prefetch.h,
// and "int8" for the int8 kernel's),
// the same for the decode attention's stream kernels ("attention_prefetch": {"scores",
// "weighted"}, matmul_layer.h), and the most bytes of K/V cache blocks live at once on their own
// huge-page mappings ("kv_cache_huge_peak_bytes", huge_page_allocator.h).
nlohmann::json gemv_json(const GraphOptions& options);
// The gemv kernel's prefetch choice for fp16 (true) or fp32 weights (gemv_prefetch.h): state,
// samples per variant, pairs prefetch won, median read speeds; gemv_json and ncnnport-gemv-check.
nlohmann::json gemv_prefetch_json(bool fp16);
// The same for the decode attention's scores (true) or weighted sums (false); gemv_json and
// ncnnport-matmul-check.
nlohmann::json attention_prefetch_json(bool scores);
// The same for the int8 one-row kernel (int8_gemv_layer.h); gemv_json and ncnnport-int8-gemv-check.
nlohmann::json int8_gemv_prefetch_json();

// The Python loop's fp32 options (runtime/options.py FP32): every C++ graph runs with these, set
// before load_param. ncnn's own defaults differ (fp16 storage on), which would change every number.
// One difference that changes no number: CPU nets run without ncnn's per-Net pool allocator (each
// call's blobs come from the heap and go back when it ends; the Python loop keeps the pools, whose
// trade-offs runtime/options.py `low_memory` documents).
ncnn::Option fp32_options(int threads, bool vulkan);
// fp32_options with exactly the flags of the precision called `precision` (precision.h, the
// flags runtime/precision.py sets for that name: Precision.options); std::invalid_argument for a
// name the C++ runtime does not run or a reduced precision with `vulkan`.
ncnn::Option precision_options(int threads, bool vulkan, const std::string& precision);
// Every ncnnport graph notes the ncnn::Option it loads with (Graph, seedvr2::Graph, verify), so a
// run reports the precision flags its nets carried, not only the name it was asked for.
void note_graph_option(const ncnn::Option& opt);
// What a run's --json-out records: {"precision": NAME, "precision_flags": the flags
// (fp16_storage, fp16_packed, fp16_arithmetic, bf16_storage) of every net opened so far in this
// process, or null before any opened, or a list of the distinct sets if nets differed}.
nlohmann::json precision_record(const std::string& precision);

// One input or output of a spec: each axis a fixed size or a symbol ("seq") bound per call.
struct TensorSpec {
    std::string name;
    std::vector<int64_t> sizes;     // -1 where the axis is symbolic
    std::vector<std::string> axes;  // the symbol, or "" for a fixed axis
    bool int32 = false;
    size_t rank() const { return sizes.size(); }
};

// Dense row-major float32 tensor WITH the leading batch axis of 1, as the spec writes shapes.
struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
    int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
};

#if NCNN_VULKAN
// One input of a recorded run (Graph::record): a host Mat, uploaded inside the command, or a
// blob already on the GPU (an earlier graph's output, a GpuKvCache view), read in place.
struct GpuInput {
    ncnn::Mat host;
    ncnn::VkMat gpu;
    static GpuInput on_host(const ncnn::Mat& m) { return {m, ncnn::VkMat()}; }
    static GpuInput on_gpu(const ncnn::VkMat& m) { return {ncnn::Mat(), m}; }
};
// Device memory for recorded runs: activations (blob and workspace allocators) and the staging
// of host inputs and downloads. ncnn's Extractor only acquires allocators itself when it
// extracts to the host; a run recorded into the caller's command takes these, and the memory of
// outputs the caller keeps stays valid while they are referenced.
class GpuArena {
public:
    explicit GpuArena(const ncnn::VulkanDevice* vkdev);
    ~GpuArena();
    GpuArena(const GpuArena&) = delete;
    GpuArena& operator=(const GpuArena&) = delete;
    // fp32 options (fp32_options) whose Vulkan allocators are this arena's.
    const ncnn::Option& options() const { return opt_; }

private:
    std::unique_ptr<ncnn::VkBlobAllocator> blob_, workspace_;
    std::unique_ptr<ncnn::VkStagingAllocator> staging_;
    ncnn::Option opt_;
};

// Shape of a float32 VkMat as numpy sees it (packed axes unpacked), without batch axis.
std::vector<int64_t> vkmat_shape(const ncnn::VkMat& m);
#endif

// Copy of a [1, ...] float32 tensor (rank 2..5) as an ncnn Mat without its batch axis.
ncnn::Mat to_mat(const Tensor& t);
// A [1, n] int32 id row as a 1-D ncnn Mat of int bits (ncnn reads int32 ids as raw 4-byte words).
ncnn::Mat ids_mat(const std::vector<int32_t>& ids);
// Shape of a Mat as numpy sees it (c, d, h, w by dims), without batch axis.
std::vector<int64_t> mat_shape(const ncnn::Mat& m);

class Graph {
public:
    // Reads PACKAGE/specs/NAME.spec.json and loads PACKAGE/ncnn/NAME.ncnn.{param,bin}; throws
    // PackageError naming the file when one is missing, malformed or rejected by ncnn.
    // With `variant`: the graph variant PACKAGE/ncnn/NAME.VARIANT.ncnn.param over NAME's .bin and
    // spec (ncnnport.contract.GraphVariant: same weights, rewritten layers); errors name NAME.VARIANT.
    Graph(const std::filesystem::path& package, const std::string& name, const GraphOptions& options,
          const std::string& variant = "");
    ~Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    // Inputs in spec order. Checks each Mat against its spec (rank, fixed sizes, one value per
    // symbol; float32, or fp16 for an input that only a MatMul overwrite reading fp16 rows
    // takes), feeds and extracts every output, checking return codes, and returns outputs in
    // spec order, shapes fitted to the spec rank (unit axes only) and checked.
    std::vector<Tensor> run(const std::vector<ncnn::Mat>& inputs);
    // run() without the copy into Tensors: the outputs as ncnn returned them (float32, pack 1,
    // each checked against its spec as run() checks it; a Mat of up to 2 dims is one contiguous
    // row-major block). For an output the host only scans once, e.g. a decode step's logits
    // (Qwen3-ASR: 608 KB a step, which the copy read and wrote once more).
    std::vector<ncnn::Mat> run_mats(const std::vector<ncnn::Mat>& inputs);
    // run() for each call, outputs in call order: up to split().workers calls at once, each on
    // split().threads_each threads (the net was loaded for that count: ncnn's Gemm keeps it).
    // For independent calls, e.g. the windows of a window segment. The first error any call
    // raised is rethrown after every started call ended. A call that would run alone on the
    // split net (a batch of one, or the one left after the full rounds) runs on the same graph
    // loaded for all the threads (solo(); runtime/session.NcnnModule.run_each is the same rule).
    std::vector<std::vector<Tensor>> run_each(const std::vector<std::vector<ncnn::Mat>>& calls);
    const CallSplit& split() const { return split_; }
    // This graph loaded for all the threads (itself when split() gives each call all of them),
    // opened on the first call that needs it: its weights once more while this graph lives.
    Graph& solo();
    // Whether solo() opened a second net, and whether this graph's own (split) net is loaded:
    // a split graph loads it on its first batch of several calls (reported beside the split).
    bool solo_open() const { return solo_ != nullptr; }
    bool loaded() const { return loaded_; }

#if NCNN_VULKAN
    // Records this graph into `cmd` without submitting it: inputs checked against the spec as in
    // run(), outputs returned as GPU blobs in spec order (rank and fixed sizes checked; their
    // packing is ncnn's). Chaining graphs this way keeps activations and the KV cache on the
    // device: nothing crosses to the host until the caller downloads and submits. Only for a
    // graph opened with GraphOptions::vulkan.
    std::vector<ncnn::VkMat> record(ncnn::VkCompute& cmd, const std::vector<GpuInput>& inputs, const GpuArena& arena);
    // The downloaded Mat of output `index` (after the command ran) as a checked Tensor.
    Tensor host_output(size_t index, const ncnn::Mat& m) const;
    const ncnn::VulkanDevice* vulkan_device() const;
#endif
    const std::string& name() const { return name_; }
    // True when this graph's InnerProducts are ncnnport's (register_gemv_for).
    bool gemv() const { return gemv_; }
    const std::vector<TensorSpec>& inputs() const { return inputs_; }
    const std::vector<TensorSpec>& outputs() const { return outputs_; }
    // Seconds spent inside ncnn (input + extract) over every run, and the wall time of every
    // run_each batch whose calls ran side by side (they overlap): the graphs' own time, never
    // the loading of a net (a split graph's and solo()'s load before the clock starts).
    double seconds() const { return seconds_; }
    // The part of seconds() that ncnnport's one-row kernels spent streaming weights
    // (stream_times.h weight_stream_seconds, read around each call). Exact while one graph runs at
    // a time, as decode steps do; a run_each batch counts every stream of its wall time.
    double stream_seconds() const { return stream_seconds_; }

private:
    void load() const;
    void ensure_loaded() const;
    // One call; `ncnn_s` (when given) receives the seconds of its input + extract alone.
    std::vector<Tensor> run_call(const std::vector<ncnn::Mat>& inputs, double* ncnn_s = nullptr) const;
    // The input binding and extraction of run_call: every output Mat (spec order), `sizes` the
    // symbols the inputs bound.
    std::vector<ncnn::Mat> extract_call(const std::vector<ncnn::Mat>& inputs, std::map<std::string, int64_t>& sizes,
                                        double* ncnn_s) const;
    // fetch_output's checks alone (float32, pack 1, the spec's shape): the output's shape.
    std::vector<int64_t> check_output(const TensorSpec& spec, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const;
    void bind_input(const TensorSpec& spec, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const;
    Tensor fetch_output(const TensorSpec& spec, const ncnn::Mat& m, std::map<std::string, int64_t>& sizes) const;
    std::vector<int64_t> fit_output_shape(const TensorSpec& spec, std::vector<int64_t> shape,
                                          std::map<std::string, int64_t>& sizes) const;

    std::string name_;
    std::vector<TensorSpec> inputs_;
    std::vector<TensorSpec> outputs_;
    // Inputs that may be fp16 cache rows (kv_cache.h KvRows::Fp16): each feeds only the B operand
    // of a MatMul, and ncnnport's decode MatMul, which reads 2-byte rows, is registered on this
    // net (fp16_cache_inputs_active). Any other 2-byte input would be misread.
    mutable std::vector<std::string> fp16_cache_inputs_;
    std::unique_ptr<ncnn::Net> net_;
    double seconds_ = 0.0;
    double stream_seconds_ = 0.0;
    mutable bool gemv_ = false;
    mutable std::atomic<bool> loaded_{false};
    mutable std::mutex load_mutex_;
    CallSplit split_;
    std::unique_ptr<CallWorkers> workers_;  // run_each's threads, started on its first batch
    // what solo() needs to open the same graph for all the threads
    std::filesystem::path package_;
    std::string base_name_, variant_;
    GraphOptions options_;
    std::unique_ptr<Graph> solo_;
};

// A spec file's input/output list ("inputs" or "outputs") as TensorSpecs.
std::vector<TensorSpec> read_tensor_specs(const JsonFile& spec, const std::string& field);

// Seconds spent so far in the graphs of `graphs` whose name starts with one of `prefixes` (an
// executable's opened graphs by name: the share of a step its decode layers, its head or its
// vision segments took, read before and after the step).
double graph_seconds_of(const std::map<std::string, std::unique_ptr<Graph>>& graphs,
                        const std::vector<std::string>& prefixes);
// The same graphs' Graph::stream_seconds: how much of graph_seconds_of was the weights' streams.
double graph_stream_seconds_of(const std::map<std::string, std::unique_ptr<Graph>>& graphs,
                               const std::vector<std::string>& prefixes);

}  // namespace ncnnport
