#include "ncnnport/memory_data_layer.h"

#include "ncnnport/builtin_overwrite.h"

#include <layer.h>
#include <layer_type.h>
#include <mat.h>
#include <modelbin.h>
#include <paramdict.h>

#include <atomic>
#include <memory>
#include <vector>

namespace ncnnport {

namespace {

std::atomic<uint64_t> g_shares{0};

// ncnn's MemoryData for loading (the same parameters and .bin records, through the built-in), its
// data handed on by reference.
class SharedMemoryData : public ncnn::Layer {
public:
    SharedMemoryData() {
        one_blob_only = false;
        support_inplace = false;
    }

    int load_param(const ncnn::ParamDict& pd) override {
        builtin_.reset(ncnn::create_layer_cpu(ncnn::LayerType::MemoryData));
        if (!builtin_) return -1;
        const int ret = builtin_->load_param(pd);
        if (ret != 0) return ret;
        adopt_builtin_flags(*this, *builtin_);
        return 0;
    }

    // The built-in reads the records; one forward through it keeps its (reference-counted) data.
    int load_model(const ncnn::ModelBin& mb) override {
        const int ret = builtin_->load_model(mb);
        if (ret != 0) return ret;
        ncnn::Option opt;
        opt.lightmode = true;
        opt.use_packing_layout = false;
        std::vector<ncnn::Mat> tops(1);
        if (builtin_->forward(std::vector<ncnn::Mat>(), tops, opt) != 0 || tops[0].empty()) return -100;
        data_ = tops[0];
        builtin_.reset();  // its copy goes: one copy of the constant stays
        return 0;
    }

    int forward(const std::vector<ncnn::Mat>& /*bottoms*/, std::vector<ncnn::Mat>& tops, const ncnn::Option& opt) const override {
        if (!opt.lightmode) {
            tops[0] = data_.clone(opt.blob_allocator);
            return tops[0].empty() ? -100 : 0;
        }
        tops[0] = data_;  // shares data_'s reference count: ncnn clones it before any in-place use
        g_shares.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }

private:
    std::unique_ptr<ncnn::Layer> builtin_;
    ncnn::Mat data_;
};

}  // namespace

bool register_memory_data_layer(ncnn::Net& net) { return register_overwrite_of<SharedMemoryData>(net, "MemoryData"); }

uint64_t memory_data_shares() { return g_shares.load(std::memory_order_relaxed); }

}  // namespace ncnnport
