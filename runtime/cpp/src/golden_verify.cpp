#include "ncnnport/golden_verify.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "ncnnport/manifest.h"
#include "ncnnport/ncnn_graph.h"
#include "ncnnport/npz.h"
#include "ncnnport/policy.h"
#include "ncnnport/precision.h"
#include "ncnnport/sha256.h"

#include <gpu.h>  // ncnn (get_gpu_count under NCNN_VULKAN)
#include <net.h>  // ncnn

namespace fs = std::filesystem;
using nlohmann::json;

namespace ncnnport {
namespace {

constexpr const char* kSpecSuffix = ".spec.json";

// ---------------------------------------------------------------------------------------------
// spec files (ncnnport.contract.TensorSpec / Tolerance as written by convert)

struct Dim {
    std::string axis;    // empty: a fixed size
    int64_t value = 0;   // the fixed size, or the offset of "axis+K"
};

struct Tensor {
    std::string name;
    std::vector<Dim> shape;
    std::string dtype;
    int feature_axis = -1;
};

using Tolerance = Gate;  // ncnnport.contract.Tolerance, defaults included

struct GraphSpec {
    std::string name;
    std::vector<Tensor> inputs, outputs;
    std::map<std::string, Tolerance> tolerances;
};

[[noreturn]] void bad(const std::string& line) { throw BadPackage(line); }

json read_json_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) bad(path.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    json doc = json::parse(ss.str(), nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) bad(path.string() + ": not a JSON object");
    return doc;
}

Dim parse_dim(const json& d, const std::string& where) {
    static const std::regex axis_re(R"(([A-Za-z_][A-Za-z0-9_]*)(?:\+(\d+))?)");
    if (d.is_number_integer() && d.get<int64_t>() >= 0) return {"", d.get<int64_t>()};
    std::smatch m;
    const std::string s = d.is_string() ? d.get<std::string>() : "";
    if (!d.is_string() || !std::regex_match(s, m, axis_re)) bad(where + ": bad axis " + d.dump());
    return {m[1].str(), m[2].matched ? std::stoll(m[2].str()) : 0};
}

std::vector<Tensor> parse_tensors(const json& items, const std::string& where) {
    if (!items.is_array()) bad(where + ": not a list");
    std::vector<Tensor> out;
    for (size_t i = 0; i < items.size(); ++i) {
        const json& t = items[i];
        const std::string at = where + "[" + std::to_string(i) + "]";
        if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("shape") ||
            !t["shape"].is_array() || t["shape"].empty())
            bad(at + ": needs 'name' (string) and 'shape' (non-empty list)");
        Tensor ten{t["name"].get<std::string>(), {}, t.value("dtype", std::string("float32")), -1};
        if (ten.dtype != "float32" && ten.dtype != "int32") bad(at + ".dtype: '" + ten.dtype + "' not float32 or int32");
        for (const auto& d : t["shape"]) ten.shape.push_back(parse_dim(d, at + ".shape"));
        if (!ten.shape[0].axis.empty() || ten.shape[0].value != 1) bad(at + ".shape: must start with a batch axis of 1");
        const json fa = t.value("feature_axis", json(-1));
        const int rank = int(ten.shape.size());
        if (!fa.is_number_integer() || fa.get<int>() < -rank || fa.get<int>() >= rank)
            bad(at + ".feature_axis: outside the shape");
        ten.feature_axis = fa.get<int>();
        out.push_back(std::move(ten));
    }
    return out;
}

Tolerance parse_tolerance(const json& raw, const std::string& where) {
    if (!raw.is_object()) bad(where + ": not an object");
    Tolerance t;
    for (auto [key, field] : {std::pair<const char*, double*>{"min_cosine", &t.min_cosine},
                              {"max_abs_rel", &t.max_abs_rel}, {"max_abs_floor", &t.max_abs_floor}}) {
        if (!raw.contains(key)) continue;
        if (!raw[key].is_number()) bad(where + "." + key + ": not a number");
        *field = raw[key].get<double>();
    }
    for (const auto& item : raw.items()) {
        if (item.key() != "min_cosine" && item.key() != "max_abs_rel" && item.key() != "max_abs_floor")
            bad(where + ": unknown field '" + item.key() + "'");
    }
    return t;
}

GraphSpec read_spec(const fs::path& path) {
    const json doc = read_json_file(path);
    const std::string where = path.string();
    GraphSpec spec;
    spec.name = path.filename().string();
    spec.name.resize(spec.name.size() - std::strlen(kSpecSuffix));
    if (!doc.contains("inputs") || !doc.contains("outputs")) bad(where + ": needs 'inputs' and 'outputs'");
    spec.inputs = parse_tensors(doc["inputs"], where + ": inputs");
    spec.outputs = parse_tensors(doc["outputs"], where + ": outputs");
    const json tols = doc.value("tolerances", json::object());
    if (!tols.is_object()) bad(where + ": tolerances: not an object");
    for (const auto& item : tols.items())
        spec.tolerances[item.key()] = parse_tolerance(item.value(), where + ": tolerances." + item.key());
    return spec;
}

// The spec's own gates (an output's, else "*", else the fp32 default): verify.py's _tolerance.
ModuleGates spec_gates(const GraphSpec& spec) {
    ModuleGates gates;
    for (const auto& [output, tol] : spec.tolerances) {
        if (output == "*") gates.star = tol;
        else gates.outputs[output] = tol;
    }
    return gates;
}

std::vector<GraphSpec> read_specs(const fs::path& package) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (fs::directory_iterator it(package / "specs", ec), end; !ec && it != end; it.increment(ec)) {
        const std::string n = it->path().filename().string();
        if (n.size() > std::strlen(kSpecSuffix) && n.compare(n.size() - std::strlen(kSpecSuffix), std::string::npos, kSpecSuffix) == 0)
            files.push_back(it->path());
    }
    if (ec) bad((package / "specs").string() + ": cannot list (" + ec.message() + ")");
    std::sort(files.begin(), files.end());
    std::vector<GraphSpec> specs;
    for (const auto& f : files) specs.push_back(read_spec(f));
    return specs;
}

// ---------------------------------------------------------------------------------------------
// golden files (ncnnport.package.golden layout)

struct GoldenCase {
    std::vector<std::pair<std::string, int64_t>> sizes;  // in case{k}/axes order
    std::vector<NpyArray> inputs, outputs;
};

std::vector<NpyArray> indexed(std::map<std::string, NpyArray>& data, const std::string& prefix) {
    std::vector<NpyArray> out;
    for (size_t i = 0;; ++i) {
        auto it = data.find(prefix + std::to_string(i));
        if (it == data.end()) return out;
        out.push_back(std::move(it->second));
    }
}

std::vector<GoldenCase> read_golden(const fs::path& path) {
    std::map<std::string, NpyArray> data;
    try {
        data = read_npz(path);
    } catch (const NpzError& e) {
        bad(std::string(e.what()) + " (not a golden-vector file)");
    }
    std::vector<GoldenCase> cases;
    for (size_t k = 0;; ++k) {
        const std::string c = "case" + std::to_string(k) + "/";
        auto sizes = data.find(c + "sizes");
        if (sizes == data.end()) break;
        GoldenCase gc;
        std::vector<std::string> axes;
        if (auto a = data.find(c + "axes"); a != data.end()) {
            if (a->second.dtype != "str") bad(path.string() + ": " + c + "axes: not a string array");
            axes = a->second.strings;
        }
        if (sizes->second.dtype != "int64") bad(path.string() + ": " + c + "sizes: not int64");
        const auto* v = reinterpret_cast<const int64_t*>(sizes->second.data.data());
        for (size_t i = 0; i < axes.size() && i < size_t(sizes->second.size()); ++i) gc.sizes.emplace_back(axes[i], v[i]);
        gc.inputs = indexed(data, c + "in");
        gc.outputs = indexed(data, c + "out");
        cases.push_back(std::move(gc));
    }
    if (cases.empty()) bad(path.string() + ": holds no golden cases");
    return cases;
}

// ---------------------------------------------------------------------------------------------
// shapes (ncnnport.runtime.session.infer_sizes / check_output)

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

std::string spec_text(const std::vector<Dim>& shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) {
        const Dim& d = shape[i];
        s += i ? ", " : "";
        s += d.axis.empty() ? std::to_string(d.value) : "'" + d.axis + (d.value ? "+" + std::to_string(d.value) : "") + "'";
    }
    return s + ")";
}

// Axis sizes read off the inputs; a rank, dtype or size that does not fit the spec is BadPackage
// naming the module and blob (checked before anything reaches ncnn).
std::map<std::string, int64_t> infer_sizes(const GraphSpec& spec, const std::vector<NpyArray>& arrays) {
    if (arrays.size() != spec.inputs.size())
        bad("module " + spec.name + ": golden case has " + std::to_string(arrays.size()) + " inputs, spec has " +
            std::to_string(spec.inputs.size()));
    std::map<std::string, int64_t> sizes;
    for (size_t i = 0; i < arrays.size(); ++i) {
        const Tensor& t = spec.inputs[i];
        const NpyArray& a = arrays[i];
        const std::string at = "module " + spec.name + ", input " + t.name + ": ";
        if (a.shape.size() != t.shape.size())
            bad(at + "got rank " + std::to_string(a.shape.size()) + " shape " + shape_text(a.shape) + ", spec " + spec_text(t.shape));
        if (a.dtype != t.dtype) bad(at + "got dtype " + a.dtype + ", spec " + t.dtype);
        for (size_t j = 0; j < t.shape.size(); ++j) {
            const Dim& d = t.shape[j];
            const int64_t n = a.shape[j];
            if (d.axis.empty()) {
                if (d.value != n) bad(at + "got shape " + shape_text(a.shape) + ", spec " + spec_text(t.shape));
                continue;
            }
            auto [it, fresh] = sizes.emplace(d.axis, n - d.value);
            if (n - d.value < 0 || (!fresh && it->second != n - d.value))
                bad(at + "axis '" + d.axis + "' is " + std::to_string(n) + " here but " + d.axis + "=" +
                    std::to_string(it->second) + " from an earlier input");
        }
    }
    return sizes;
}

// ---------------------------------------------------------------------------------------------
// numpy <-> ncnn::Mat (ncnnport.runtime.mats: the leading batch axis of 1 dropped; float32 or
// int32 bits, 4 bytes an element)

ncnn::Mat to_mat(const NpyArray& a, const std::string& what) {
    std::vector<int> d(a.shape.begin() + 1, a.shape.end());  // w is last
    for (int64_t n : a.shape) {
        if (n > std::numeric_limits<int>::max()) bad(what + ": dimension too large for ncnn");
    }
    ncnn::Mat m;
    switch (d.size()) {
        case 1: m.create(d[0], size_t(4)); break;
        case 2: m.create(d[1], d[0], size_t(4)); break;
        case 3: m.create(d[2], d[1], d[0], size_t(4)); break;
        case 4: m.create(d[3], d[2], d[1], d[0], size_t(4)); break;
        default: bad(what + ": rank " + std::to_string(a.shape.size()) + " is not 2..5 (ncnn's 4 dims + batch)");
    }
    if (a.size() == 0) return m;
    if (m.empty()) bad(what + ": ncnn could not allocate " + shape_text(a.shape));
    const size_t plane = size_t(m.w) * m.h * m.d * 4;
    for (int q = 0; q < m.c; ++q) std::memcpy(m.channel(q), a.data.data() + q * plane, plane);
    return m;
}

struct Array {
    std::vector<int64_t> shape;
    std::vector<double> values;
};

// ncnn's output as numpy would see it ((c, d, h, w) with the empty dims left out), the batch
// axis restored, then unit axes after it removed or inserted to reach `rank` (mats.from_mat).
std::optional<Array> from_mat(const ncnn::Mat& m, size_t rank, std::string& why) {
    if (m.elemsize != 4 || m.elempack != 1) {
        why = "ncnn returned elemsize " + std::to_string(m.elemsize) + " elempack " + std::to_string(m.elempack);
        return std::nullopt;
    }
    Array out;
    out.shape = {1};
    if (m.dims == 1) out.shape.insert(out.shape.end(), {m.w});
    if (m.dims == 2) out.shape.insert(out.shape.end(), {m.h, m.w});
    if (m.dims == 3) out.shape.insert(out.shape.end(), {m.c, m.h, m.w});
    if (m.dims == 4) out.shape.insert(out.shape.end(), {m.c, m.d, m.h, m.w});
    const size_t plane = size_t(m.w) * m.h * m.d;
    out.values.reserve(plane * m.c);
    for (int q = 0; q < m.c; ++q) {
        const float* p = m.channel(q);
        out.values.insert(out.values.end(), p, p + plane);
    }
    while (out.shape.size() > rank && out.shape[1] == 1) out.shape.erase(out.shape.begin() + 1);
    while (out.shape.size() < rank) out.shape.insert(out.shape.begin() + 1, 1);
    if (out.shape.size() != rank) {
        why = "ncnn returned shape that cannot be rank " + std::to_string(rank);
        return std::nullopt;
    }
    return out;
}

// The output fitted to the spec's shape (unit axes only), or the reason it does not fit.
bool fit_output(const Tensor& t, Array& arr, const std::map<std::string, int64_t>& sizes, std::string& why) {
    std::vector<int64_t> want;
    bool known = true;
    for (const Dim& d : t.shape) {
        if (d.axis.empty()) {
            want.push_back(d.value);
        } else if (auto it = sizes.find(d.axis); it != sizes.end()) {
            want.push_back(it->second + d.value);
        } else {
            want.push_back(-1);
            known = false;
        }
    }
    int64_t want_n = 1;
    for (int64_t n : want) want_n *= n;
    if (known && size_t(want_n) == arr.values.size()) {
        std::vector<int64_t> a, b;
        for (int64_t n : arr.shape) if (n != 1) a.push_back(n);
        for (int64_t n : want) if (n != 1) b.push_back(n);
        if (a != b) {
            why = "shape " + shape_text(arr.shape) + ", expected " + shape_text(want);
            return false;
        }
        arr.shape = want;
        return true;
    }
    for (size_t i = 0; i < want.size() && arr.shape.size() == want.size(); ++i) {
        if (want[i] >= 0 && want[i] != arr.shape[i]) {
            why = "shape " + shape_text(arr.shape) + ", spec " + spec_text(t.shape);
            return false;
        }
    }
    if (arr.shape.size() != want.size()) {
        why = "rank " + std::to_string(arr.shape.size()) + ", spec " + spec_text(t.shape);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// metrics (ncnnport.metrics.compare / judge)

struct Stats {
    double cosine = 1, worst_row_cosine = 1, max_abs = 0, ref_absmax = 0;
    int64_t nan = 0, inf = 0;
};

std::vector<double> as_doubles(const NpyArray& a, const std::string& what) {
    const int64_t n = a.size();
    std::vector<double> out(static_cast<size_t>(n));
    const unsigned char* p = a.data.data();
    for (int64_t i = 0; i < n; ++i) {
        if (a.dtype == "float32") { float v; std::memcpy(&v, p + 4 * i, 4); out[i] = v; }
        else if (a.dtype == "int32") { int32_t v; std::memcpy(&v, p + 4 * i, 4); out[i] = v; }
        else if (a.dtype == "float64") { std::memcpy(&out[i], p + 8 * i, 8); }
        else if (a.dtype == "int64") { int64_t v; std::memcpy(&v, p + 8 * i, 8); out[i] = double(v); }
        else bad(what + ": reference dtype " + a.dtype + " is not numeric");
    }
    return out;
}

double cosine(const double* a, const double* b, size_t n) {
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; ++i) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
    na = std::sqrt(na);
    nb = std::sqrt(nb);
    if (na == 0.0 && nb == 0.0) return 1.0;
    if (na == 0.0 || nb == 0.0) return 0.0;
    return dot / (na * nb);
}

// `v` with axis `axis` of `shape` moved last (C order), as np.moveaxis(...).reshape(-1).
std::vector<double> axis_last(const std::vector<double>& v, const std::vector<int64_t>& shape, size_t axis) {
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < axis; ++i) outer *= shape[i];
    for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
    const int64_t feat = shape[axis];
    std::vector<double> out(v.size());
    size_t k = 0;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i)
            for (int64_t f = 0; f < feat; ++f) out[k++] = v[(o * feat + f) * inner + i];
    return out;
}

Stats compare(const std::vector<double>& r, const std::vector<double>& c, const std::vector<int64_t>& shape, int feature_axis) {
    Stats s;
    bool finite = true;
    for (size_t i = 0; i < c.size(); ++i) {
        s.nan += std::isnan(c[i]);
        s.inf += std::isinf(c[i]);
        finite = finite && std::isfinite(c[i]) && std::isfinite(r[i]);
    }
    if (r.empty()) return s;
    if (!finite) {
        s.cosine = s.worst_row_cosine = std::numeric_limits<double>::quiet_NaN();
        s.max_abs = std::numeric_limits<double>::infinity();
        for (double x : r) if (std::isfinite(x)) s.ref_absmax = std::max(s.ref_absmax, std::fabs(x));
        return s;
    }
    for (size_t i = 0; i < r.size(); ++i) {
        s.max_abs = std::max(s.max_abs, std::fabs(c[i] - r[i]));
        s.ref_absmax = std::max(s.ref_absmax, std::fabs(r[i]));
    }
    if (s.max_abs == 0.0) return s;  // bit-identical: exact 1.0 cosines
    const size_t rank = shape.size();
    const size_t axis = size_t(feature_axis < 0 ? feature_axis + int(rank) : feature_axis);
    std::vector<double> rr = r, cc = c;
    if (axis != rank - 1) {
        rr = axis_last(r, shape, axis);
        cc = axis_last(c, shape, axis);
    }
    const size_t feat = shape[axis] > 0 ? size_t(shape[axis]) : 1;
    s.cosine = cosine(rr.data(), cc.data(), rr.size());
    s.worst_row_cosine = std::numeric_limits<double>::infinity();
    for (size_t row = 0; row * feat < rr.size(); ++row)
        s.worst_row_cosine = std::min(s.worst_row_cosine, cosine(rr.data() + row * feat, cc.data() + row * feat, feat));
    return s;
}

std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

// Python's repr of a float: the shortest decimal that reads back to the same double.
std::string py_float(double v) {
    for (int p = 1; p <= 17; ++p) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*g", p, v);
        if (std::strtod(buf, nullptr) == v) {
            std::string s = buf;
            if (s.find_first_of(".en") == std::string::npos) s += ".0";
            return s;
        }
    }
    return fmt("%.17g", v);
}

// (passed, reason) exactly as metrics.judge words it.
std::pair<bool, std::string> judge(const Stats& s, const Tolerance& tol) {
    if (s.nan || s.inf) return {false, std::to_string(s.nan) + " NaN / " + std::to_string(s.inf) + " Inf"};
    const double allowed = std::max(tol.max_abs_rel * s.ref_absmax, tol.max_abs_floor);
    std::vector<std::string> problems;
    if (s.cosine < tol.min_cosine) problems.push_back("cosine " + fmt("%.9f", s.cosine) + " < " + py_float(tol.min_cosine));
    if (s.worst_row_cosine < tol.min_cosine)
        problems.push_back("worst-row cosine " + fmt("%.9f", s.worst_row_cosine) + " < " + py_float(tol.min_cosine));
    if (s.max_abs > allowed) problems.push_back("max_abs " + fmt("%.3g", s.max_abs) + " > " + fmt("%.3g", allowed));
    std::string why;
    for (size_t i = 0; i < problems.size(); ++i) why += (i ? "; " : "") + problems[i];
    return {problems.empty(), why};
}

// ---------------------------------------------------------------------------------------------
// running a graph

ncnn::Option run_option(const VerifyOptions& options) {
    return precision_options(options.threads, options.vulkan, options.precision);
}

void load_graph(ncnn::Net& net, const fs::path& package, const GraphSpec& spec, const VerifyOptions& options) {
    const fs::path param = package / "ncnn" / (spec.name + ".ncnn.param");
    const fs::path bin = package / "ncnn" / (spec.name + ".ncnn.bin");
    for (const auto& p : {param, bin})
        if (!fs::is_regular_file(p)) bad("module " + spec.name + ": missing " + p.string());
    net.opt = run_option(options);
#if NCNN_VULKAN
    if (options.vulkan) {
        // ncnn would silently run on the CPU; a "vulkan" row must come from a Vulkan device
        if (ncnn::get_gpu_count() == 0) bad("module " + spec.name + ": Vulkan requested but ncnn sees no GPU");
        net.set_vulkan_device(0);
    }
#endif
    register_gemv_for(net, GraphOptions{options.threads, options.vulkan, options.gemv, options.precision});
    note_graph_option(net.opt);
    if (net.load_param(param.string().c_str()) != 0) bad("module " + spec.name + ": ncnn could not load param " + param.string());
    if (net.load_model(bin.string().c_str()) != 0) bad("module " + spec.name + ": ncnn could not load weights " + bin.string());
    std::vector<std::string> blobs;
    for (const auto& b : net.blobs()) blobs.push_back(b.name);
    for (const auto* group : {&spec.inputs, &spec.outputs}) {
        for (const Tensor& t : *group) {
            if (std::find(blobs.begin(), blobs.end(), t.name) == blobs.end())
                bad("module " + spec.name + ": " + (group == &spec.inputs ? "input" : "output") + " blob '" + t.name +
                    "' not in " + param.string());
        }
    }
}

std::string sizes_label(const GoldenCase& gc, size_t k) {
    if (gc.sizes.empty()) return std::to_string(k);
    std::string s;
    for (size_t i = 0; i < gc.sizes.size(); ++i) s += (i ? "," : "") + gc.sizes[i].first + "=" + std::to_string(gc.sizes[i].second);
    return s;
}

// One row: the graph on one golden case, every output judged by its gate.
VerifyRow run_case(ncnn::Net& net, const GraphSpec& spec, const ModuleGates& gates, const GoldenCase& gc, size_t k,
                   const fs::path& golden) {
    VerifyRow row{"golden", spec.name + "[" + sizes_label(gc, k) + "]", false, ""};
    const auto sizes = infer_sizes(spec, gc.inputs);
    if (gc.outputs.size() != spec.outputs.size())
        bad(golden.string() + ": case" + std::to_string(k) + " has " + std::to_string(gc.outputs.size()) +
            " reference outputs, spec has " + std::to_string(spec.outputs.size()));
    ncnn::Extractor ex = net.create_extractor();
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
        const std::string what = "module " + spec.name + ", input " + spec.inputs[i].name;
        if (ex.input(spec.inputs[i].name.c_str(), to_mat(gc.inputs[i], what)) != 0) bad(what + ": rejected by ncnn");
    }
    std::vector<std::string> failed;
    double worst = 0.0;
    for (size_t j = 0; j < spec.outputs.size(); ++j) {
        const Tensor& t = spec.outputs[j];
        ncnn::Mat out;
        std::string why;
        const int rc = ex.extract(t.name.c_str(), out);
        std::optional<Array> arr;
        if (rc != 0) why = "extract returned " + std::to_string(rc);
        else arr = from_mat(out, t.shape.size(), why);
        if (arr && !fit_output(t, *arr, sizes, why)) arr.reset();
        const std::string ref_what = golden.string() + ": case" + std::to_string(k) + "/out" + std::to_string(j);
        if (arr && arr->shape != gc.outputs[j].shape) {
            why = "shape " + shape_text(arr->shape) + " differs from reference " + shape_text(gc.outputs[j].shape);
            arr.reset();
        }
        if (!arr) {
            failed.push_back(t.name + ": " + why);
            continue;
        }
        const Stats s = compare(as_doubles(gc.outputs[j], ref_what), arr->values, arr->shape, t.feature_axis);
        const auto [ok, reason] = judge(s, gates.of(t.name));
        worst = std::max(worst, s.max_abs / std::max(s.ref_absmax, 1e-30));
        if (!ok) failed.push_back(t.name + ": " + reason);
    }
    row.passed = failed.empty();
    for (size_t i = 0; i < failed.size(); ++i) row.detail += (i ? "; " : "") + failed[i];
    if (row.passed) row.detail = "relative max_abs " + fmt("%.2e", worst);
    return row;
}

// model.json's `precision` (package/model_json.py PACKAGE_PRECISIONS) -> the policy mode of that
// runtime/precision.py entry; "fp32" for a package without model.json or without the field (built
// before derived packages said theirs).
const std::map<std::string, std::string>& package_precision_modes() {
    static const std::map<std::string, std::string> modes = {
        {"fp32", "fp32"}, {"fp16-weights", "fp16_weights"}, {"int8-weights", "int8_weights"}};
    return modes;
}

std::string package_precision(const fs::path& package) {
    const fs::path path = package / "model.json";
    if (!fs::is_regular_file(path)) return "fp32";
    const json doc = read_json_file(path);
    if (!doc.contains("precision")) return "fp32";
    const json& value = doc["precision"];
    if (!value.is_string() || !package_precision_modes().count(value.get<std::string>()))
        bad(path.string() + ": field 'precision' is " + value.dump() + ", not one of fp32, fp16-weights, int8-weights");
    return value.get<std::string>();
}

// The policy mode that judges a run (drivers/verify.judging_mode): a derived package's weight
// precision, else the precision of the run's ncnn flags (--precision), through
// runtime/precision.judging_mode: Vulkan has budgets of its own.
std::string judging_mode(const VerifyOptions& options, const std::string& precision) {
    const std::string mode = precision != "fp32" ? package_precision_modes().at(precision)
                                                 : checked_precision(options.precision, options.vulkan).mode;
    if (!options.vulkan) return mode;
    return mode == "fp32" ? "vulkan_fp32" : "vulkan_fp16";
}

// The packaged policy, read only for a mode other than fp32 (verify.py's _gates): a package
// without one can be judged in fp32 on the CPU only.
std::optional<TolerancePolicy> policy_for(const fs::path& package, const std::string& mode) {
    if (mode == "fp32") return std::nullopt;
    const fs::path file = package / "policy.json";
    if (!fs::is_regular_file(file))
        bad(file.string() + ": missing; this package can be verified in fp32 on the CPU only (asked for " + mode + ")");
    try {
        return TolerancePolicy::load(file);
    } catch (const PackageError& e) {
        bad(e.what());
    }
}

// Per-output gates of a graph: the spec's own in fp32, else the policy's budget for `mode`.
ModuleGates gates_for(const GraphSpec& spec, const std::optional<TolerancePolicy>& policy, const std::string& mode) {
    if (!policy) return spec_gates(spec);
    try {
        return policy->module(spec.name, mode);
    } catch (const PackageError& e) {
        bad(e.what());
    }
}

std::vector<VerifyRow> golden_rows(const fs::path& package, const VerifyOptions& options, const std::string& mode) {
    std::vector<VerifyRow> rows;
    const std::optional<TolerancePolicy> policy = policy_for(package, mode);
    for (const GraphSpec& spec : read_specs(package)) {
        const fs::path golden = package / "golden" / (spec.name + ".npz");
        if (!fs::is_regular_file(golden)) {
            rows.push_back({"golden", spec.name, false, golden.string() + ": missing"});
            continue;
        }
        const std::vector<GoldenCase> cases = read_golden(golden);
        const ModuleGates gates = gates_for(spec, policy, mode);
        ncnn::Net net;
        load_graph(net, package, spec, options);
        for (size_t k = 0; k < cases.size(); ++k) rows.push_back(run_case(net, spec, gates, cases[k], k, golden));
    }
    return rows;
}

// A warning row when the package names another ncnn than the one linked in (verify.py's).
std::optional<VerifyRow> version_row(const fs::path& package) {
    const json doc = json::parse(std::ifstream(package / kManifestName), nullptr, false);
    if (!doc.is_object() || !doc.contains("versions") || !doc["versions"].is_object()) return std::nullopt;
    const json built = doc["versions"].value("ncnn", json());
    if (!built.is_string() || built.get<std::string>() == NCNN_VERSION_STRING) return std::nullopt;
    return VerifyRow{"versions", "ncnn", true,
                     "warning: package built with ncnn " + built.get<std::string>() + ", this runtime links ncnn " +
                         NCNN_VERSION_STRING + ": golden vectors decide"};
}

#if NCNN_VULKAN
// runtime/vulkan.driver_version: Vulkan's driverVersion is vendor-encoded.
std::string driver_version(uint32_t vendor_id, uint32_t raw) {
    if (vendor_id == 0x10DE) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%u.%02u.%02u", raw >> 22, (raw >> 14) & 0xFF, (raw >> 6) & 0xFF);
        return std::string(buf) + ((raw & 0x3F) ? "." + std::to_string(raw & 0x3F) : "");
    }
    if (vendor_id == 0x10005 || raw < (1u << 12)) return std::to_string(raw);
    return std::to_string(raw >> 22) + "." + std::to_string((raw >> 12) & 0x3FF) + "." + std::to_string(raw & 0xFFF);
}
#endif

// The heading's device part as `ncnnport verify --backend vulkan` prints it (runtime/vulkan.py:
// a software rasteriser is named as such, never as a GPU).
std::string vulkan_device_text() {
#if NCNN_VULKAN
    if (ncnn::get_gpu_count() == 0) return "no Vulkan device";
    const ncnn::GpuInfo& info = ncnn::get_gpu_info(0);
    static const std::map<int, std::string> types = {{0, "discrete"}, {1, "integrated"}, {2, "virtual"}, {3, "software"}};
    static const std::map<uint32_t, std::string> vendors = {{0x10DE, "NVIDIA"}, {0x1002, "AMD"}, {0x8086, "Intel"},
                                                            {0x13B5, "ARM"}, {0x5143, "Qualcomm"}, {0x106B, "Apple"},
                                                            {0x10005, "Mesa"}};
    const std::string name = info.device_name();
    const auto t = types.find(info.type());
    const std::string type = t != types.end() ? t->second : "unknown(" + std::to_string(info.type()) + ")";
    const auto v = vendors.find(info.vendor_id());
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%04x", info.vendor_id());
    const std::string vendor = v != vendors.end() ? v->second : hex;
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    const std::string label = type == "software"
        ? "software Vulkan (" + (lower.find("llvmpipe") != std::string::npos ? std::string("lavapipe") : name) + ")"
        : "Vulkan " + type + " GPU " + name;
    return "Vulkan: " + label + " (" + name + ", " + type + ", " + vendor + " driver " +
           driver_version(info.vendor_id(), info.driver_version()) + ")";
#else
    return "no Vulkan device";
#endif
}

}  // namespace

bool VerifyResult::passed() const {
    return std::all_of(rows.begin(), rows.end(), [](const VerifyRow& r) { return r.passed; });
}

VerifyResult verify_goldens(const fs::path& package, const VerifyOptions& options) {
    if (options.threads < 1) throw std::invalid_argument("--threads must be >= 1");
    checked_precision(options.precision, options.vulkan);  // before anything is read
#if !NCNN_VULKAN
    if (options.vulkan) throw std::invalid_argument("--vulkan: this build has no Vulkan backend (make cpp VULKAN=1)");
#endif
    std::error_code ec;
    if (!fs::is_directory(package, ec)) bad(package.string() + ": no such package folder");
    VerifyResult result;
    result.mode = judging_mode(options, "fp32");
    if (!fs::is_regular_file(package / kManifestName)) {
        result.rows.push_back({"manifest", (package / kManifestName).string(), false, "missing"});
        return result;
    }
    const ManifestCheck check = check_package(package);
    std::string detail;
    for (size_t i = 0; i < check.problems.size(); ++i) detail += (i ? "; " : "") + check.problems[i];
    if (check.problems.empty()) detail = std::to_string(check.files_checked) + " files match";
    result.rows.push_back({"manifest", kManifestName, check.problems.empty(), detail});
    if (auto v = version_row(package)) result.rows.push_back(*v);
    if (!check.problems.empty()) return result;
    result.mode = judging_mode(options, package_precision(package));  // model.json hashed above
    for (auto& row : golden_rows(package, options, result.mode)) result.rows.push_back(std::move(row));
    return result;
}

std::string verify_table(const VerifyResult& result) {
    std::string s = "| check | name | result | detail |\n|---|---|---|---|\n";
    size_t failed = 0;
    for (const auto& r : result.rows) {
        s += "| " + r.kind + " | " + r.name + " | " + (r.passed ? "PASS" : "FAIL") + " | " + r.detail + " |\n";
        failed += !r.passed;
    }
    s += "\n" + std::to_string(result.rows.size() - failed) + " passed, " + std::to_string(failed) + " failed\n";
    return s;
}

std::string options_label(const VerifyOptions& options) {
    return checked_precision(options.precision, options.vulkan).label() + "/t" + std::to_string(options.threads)
           + (options.vulkan ? "/vulkan" : "");
}

int run_verify(const fs::path& package, const VerifyOptions& options, const std::string& error_prefix) {
    try {
        const VerifyResult result = verify_goldens(package, options);
        std::cout << "## verify " << package.string() << " (" << options_label(options) << "; judged as "
                  << result.mode << "; " << (options.vulkan ? vulkan_device_text() : "CPU") << ")\n"
                  << verify_table(result);
        return result.passed() ? 0 : 1;
    } catch (const BadPackage& e) {
        std::cerr << error_prefix << e.what() << "\n";
    } catch (const std::invalid_argument& e) {
        std::cerr << error_prefix << e.what() << "\n";
    } catch (const IoError& e) {
        std::cerr << error_prefix << e.what() << "\n";
    }
    return 2;
}

}  // namespace ncnnport
