// One converted graph of a package (specs/<name>.spec.json + ncnn/<name>.ncnn.{param,bin}) as
// the C++ twin of runtime/session.py's NcnnModule: inputs and outputs by the spec's blob names
// and shapes (named axes solved from the inputs), every ncnn return code checked, a fresh
// extractor per call.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <net.h>

#include "ncnnport/seedvr2_host.h"

namespace ncnnport::seedvr2 {

class GraphError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct BlobSpec {
    std::string name;
    std::vector<std::string> dims;  // a number as text or an axis name ("n", "s", "lt")
};

struct RunOptions {
    int threads = 1;
    bool vulkan = false;
    std::string precision = "fp32";  // a CPU precision of ncnnport/precision.h (--precision)
};

class Graph {
public:
    Graph(const std::filesystem::path& package, const std::string& name, const RunOptions& options);
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    const std::string& name() const { return name_; }
    const std::vector<BlobSpec>& inputs() const { return inputs_; }
    // Feeds the spec's inputs by name from ``named`` (extra entries ignored, a missing one is an
    // error), returns the outputs in spec order.
    std::vector<Tensor> run(const std::map<std::string, const Tensor*>& named);
    double seconds() const { return seconds_; }  // wall time spent inside ncnn for this graph

private:
    std::string name_;
    std::vector<BlobSpec> inputs_, outputs_;
    std::unique_ptr<ncnn::Net> net_;
    double seconds_ = 0;
};

// ncnn's Mat layout for a tensor with a leading batch axis of 1 (runtime/mats.py to_mat).
ncnn::Mat to_mat(const Tensor& t, const std::string& what);
// A Mat back to ``rank`` axes with the batch axis restored (runtime/mats.py from_mat).
Tensor from_mat(const ncnn::Mat& m, size_t rank, const std::string& what);

}  // namespace ncnnport::seedvr2
