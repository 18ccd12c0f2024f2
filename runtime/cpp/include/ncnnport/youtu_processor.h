// Youtu-VL image processing on the host: the C++ twin of models/youtu_vl/processor.py and of the
// host tables in pipeline.vision_inputs / runtime.rope / runtime.rope2d.
//
// Why bit-exact: the processor's output is the model's input, so any rounding difference here is
// a different image to the vision tower. Each step keeps the Python code's operation order and
// precision: the resize rule's in-place float64 scale decrement, torch's uint8 antialiased
// bilinear kernel (float64 taps, int16 fixed point, width pass then height pass through a clipped
// uint8 intermediate), the fused float32 normalisation (x - 255*mean) / (255*std), the
// merge-block-major patch order and the window layout over merged tokens.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "ncnnport/image_io.h"

namespace ncnnport::youtu {

// An image or size the processor cannot take (empty, or no scale fits the patch cap).
class ProcessorError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

struct ProcessorConfig {
    int patch = 16;
    int merge = 2;
    int64_t max_patches = 36864;
    double scale_step = 0.02;
    std::array<float, 3> mean{0.5f, 0.5f, 0.5f};
    std::array<float, 3> std{0.5f, 0.5f, 0.5f};
};

// processor.target_size: (H', W') by the official rule (both sides rounded up to patch*merge at
// scale 1, then scale -= step in place while the patch count exceeds the cap).
std::pair<int, int> target_size(int height, int width, int patch, int merge, int64_t max_patches, double step);

// processor.axis_weights: int16-range taps of torch's antialiased bilinear uint8 kernel.
struct AxisWeights {
    std::vector<int64_t> start;  // [out] first input index
    std::vector<int64_t> taps;   // [out * width], zero past each row's size
    int width = 0;
    int precision = 0;
};
AxisWeights axis_weights(int in_size, int out_size);

// processor.resize_uint8: width pass then height pass (an axis of equal size is not touched).
RgbImage resize_uint8(const RgbImage& image, int height, int width);

struct ProcessedImage {
    std::vector<float> pixel_values;  // [gh*gw, patch*patch*3], merge-block-major rows
    int grid_h = 0, grid_w = 0;       // patch grid
    int resized_h = 0, resized_w = 0;
    int original_h = 0, original_w = 0;
    int merge_unit = 4;
    int patch_dim = 0;
    int num_patches() const { return grid_h * grid_w; }
    int num_tokens() const { return num_patches() / merge_unit; }
};

// processor.process_image: size rule, resize, fused normalisation, patchify.
ProcessedImage process_image(const RgbImage& image, const ProcessorConfig& config);

// processor.patch_positions: (row, col) of every patch in merge-block-major order.
std::vector<std::array<int, 2>> patch_positions(int grid_h, int grid_w, int merge);

// processor.window_layout: merged-token index in window order and cu_seqlens over patches.
struct WindowLayout {
    std::vector<int64_t> index;
    std::vector<int64_t> cu_seqlens;
};
WindowLayout window_layout(int grid_h, int grid_w, int merge, int window_tokens);

// processor.patch_permutation: each merged token moves with its merge_unit patches.
std::vector<int64_t> patch_permutation(const std::vector<int64_t>& window_index, int merge_unit);

// rope.inv_freq: float32(i) / d in float32, 1 / theta^exponent in float32 (powf), i = 0, 2, ...
std::vector<float> inv_freq(int rotary_dim, double theta);

// rope.cos_sin over explicit positions: [n, 2*len(freqs)] = cat(p*f, p*f), angle in float32,
// cos/sin in double rounded to float32.
void cos_sin(const std::vector<int64_t>& positions, const std::vector<float>& freqs, std::vector<float>& cos,
             std::vector<float>& sin);

// rope2d.axial_cos_sin: [n, 4*len(freqs)] = cat(h*f, w*f, h*f, w*f) per (row, col).
void axial_cos_sin(const std::vector<std::array<int, 2>>& positions, const std::vector<float>& freqs,
                   std::vector<float>& cos, std::vector<float>& sin);

}  // namespace ncnnport::youtu
