#include "tied_embed.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "ncnnport/model_json.h"

namespace youtu_vl {
namespace {

using ncnnport::PackageError;

constexpr uint32_t kTagFp32 = 0;
constexpr uint32_t kTagFp16 = 0x01306B47;

struct ParamLayer {
    std::string type;
    std::map<std::string, std::string> params;
};

// The layers of an ncnn .param file (magic, counts, one layer a line).
std::vector<ParamLayer> read_param_layers(const std::filesystem::path& param) {
    std::ifstream in(param);
    if (!in) throw PackageError(param.string() + ": missing or unreadable");
    int magic = 0, layers = 0, blobs = 0;
    if (!(in >> magic >> layers >> blobs) || magic != 7767517 || layers < 0)
        throw PackageError(param.string() + ": not an ncnn param file (magic 7767517)");
    std::vector<ParamLayer> out;
    std::string line;
    std::getline(in, line);
    while (static_cast<int>(out.size()) < layers && std::getline(in, line)) {
        std::istringstream s(line);
        ParamLayer layer;
        std::string name;
        int nin = 0, nout = 0;
        if (!(s >> layer.type >> name >> nin >> nout)) continue;
        std::string tok;
        for (int i = 0; i < nin + nout && (s >> tok); ++i) {
        }
        while (s >> tok) {
            const size_t eq = tok.find('=');
            if (eq != std::string::npos) layer.params[tok.substr(0, eq)] = tok.substr(eq + 1);
        }
        out.push_back(std::move(layer));
    }
    return out;
}

int64_t param_int(const ParamLayer& layer, const std::string& key, const std::filesystem::path& param) {
    const auto it = layer.params.find(key);
    if (it == layer.params.end()) throw PackageError(param.string() + ": layer " + layer.type + " has no param " + key + "=");
    try {
        return std::stoll(it->second);
    } catch (const std::exception&) {
        throw PackageError(param.string() + ": layer " + layer.type + " param " + key + "=" + it->second + " is not an integer");
    }
}

float half_to_float(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else {  // subnormal: normalise
            int e = -1;
            uint32_t m = mant;
            do { ++e; m <<= 1; } while (!(m & 0x400));
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
        }
    } else if (exp == 31) bits = sign | 0x7F800000u | mant << 13;
    else bits = sign | (exp + 112) << 23 | mant << 13;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace

HeadTable::HeadTable(const std::filesystem::path& param, const std::filesystem::path& weights) {
    const auto layers = read_param_layers(param);
    std::string types;
    for (const auto& l : layers) types += (types.empty() ? "" : ", ") + l.type;
    if (layers.size() != 3 || layers[0].type != "Input" || layers[1].type != "RMSNorm"
        || (layers[2].type != "Gemm" && layers[2].type != "InnerProduct"))
        throw PackageError(param.string() + ": expected Input, RMSNorm, Gemm (or InnerProduct) for the tied lm_head, got " + types);
    const auto& norm = layers[1];
    const auto& gemm = layers[2];
    const int64_t hidden = param_int(norm, "0", param);
    if (param_int(norm, "2", param) != 1) throw PackageError(param.string() + ": RMSNorm without affine weights");
    int64_t vocab = 0, k = 0;
    if (gemm.type == "InnerProduct") {
        if (param_int(gemm, "1", param) != 0) throw PackageError(param.string() + ": InnerProduct with a bias is not a tied head");
        vocab = param_int(gemm, "0", param);
        const int64_t size = param_int(gemm, "2", param);
        if (vocab <= 0 || size % vocab) throw PackageError(param.string() + ": InnerProduct weight_data_size is not num_output x K");
        k = size / vocab;
    } else {
        if (param_int(gemm, "5", param) != 1 || param_int(gemm, "3", param) != 1)
            throw PackageError(param.string() + ": Gemm B is not a constant [N,K] weight (5=1 3=1)");
        vocab = param_int(gemm, "8", param);
        k = param_int(gemm, "9", param);
    }
    if (k != hidden || hidden <= 0 || vocab <= 0)
        throw PackageError(param.string() + ": Gemm K=" + std::to_string(k) + " but RMSNorm width " + std::to_string(hidden));
    const int fd = ::open(weights.c_str(), O_RDONLY);
    if (fd < 0) throw PackageError(weights.string() + ": missing or unreadable");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        throw PackageError(weights.string() + ": cannot stat");
    }
    map_size_ = static_cast<size_t>(st.st_size);
    const size_t offset = static_cast<size_t>(hidden) * 4;
    if (map_size_ < offset + 4) {
        ::close(fd);
        throw PackageError(weights.string() + ": " + std::to_string(map_size_) + " bytes, too short for the lm_head weights");
    }
    map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        throw PackageError(weights.string() + ": cannot be memory-mapped");
    }
    const auto* base = static_cast<const uint8_t*>(map_);
    uint32_t tag = 0;
    std::memcpy(&tag, base + offset, 4);
    if (tag != kTagFp32 && tag != kTagFp16) {
        ::munmap(map_, map_size_);
        map_ = nullptr;
        throw PackageError(weights.string() + ": lm_head weight storage tag is not float32/float16");
    }
    fp16_ = tag == kTagFp16;
    const size_t bytes = static_cast<size_t>(vocab) * hidden * (fp16_ ? 2 : 4);
    if (map_size_ != offset + 4 + (bytes + 3) / 4 * 4) {
        ::munmap(map_, map_size_);
        map_ = nullptr;
        throw PackageError(weights.string() + ": " + std::to_string(map_size_) + " bytes, expected "
                           + std::to_string(offset + 4 + (bytes + 3) / 4 * 4) + " for a " + std::to_string(vocab) + "x"
                           + std::to_string(hidden) + " lm_head");
    }
    values_ = base + offset + 4;
    rows_ = vocab;
    width_ = hidden;
}

HeadTable::HeadTable(HeadTable&& other) noexcept
    : map_(other.map_), map_size_(other.map_size_), values_(other.values_), fp16_(other.fp16_), rows_(other.rows_),
      width_(other.width_) {
    other.map_ = nullptr;
}

HeadTable::~HeadTable() {
    if (map_ != nullptr) ::munmap(map_, map_size_);
}

void HeadTable::row(int64_t r, float* out) const {
    if (fp16_) {
        const uint8_t* src = values_ + static_cast<size_t>(r) * width_ * 2;
        for (int64_t j = 0; j < width_; ++j) {
            uint16_t h;
            std::memcpy(&h, src + 2 * j, 2);
            out[j] = half_to_float(h);
        }
    } else {
        std::memcpy(out, values_ + static_cast<size_t>(r) * width_ * 4, static_cast<size_t>(width_) * 4);
    }
}

TiedEmbedding::TiedEmbedding(const std::filesystem::path& package, const std::vector<std::string>& heads) {
    for (const auto& name : heads) {
        tables_.emplace_back(package / "ncnn" / (name + ".ncnn.param"), package / "ncnn" / (name + ".ncnn.bin"));
        if (width_ && tables_.back().width() != width_)
            throw PackageError((package / "ncnn" / (name + ".ncnn.param")).string() + ": head shards have different widths");
        width_ = tables_.back().width();
        starts_.push_back(vocab_);
        vocab_ += tables_.back().rows();
    }
}

std::vector<float> TiedEmbedding::lookup(const std::vector<int>& ids) const {
    std::vector<float> out(ids.size() * static_cast<size_t>(width_));
    for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t id = ids[i];
        if (id < 0 || id >= vocab_)
            throw std::out_of_range("text_embed: token id " + std::to_string(id) + " out of range [0, " + std::to_string(vocab_) + ")");
        size_t k = tables_.size() - 1;
        while (starts_[k] > id) --k;
        tables_[k].row(id - starts_[k], out.data() + i * width_);
    }
    return out;
}

}  // namespace youtu_vl
