// SeedVR2's host steps in C++: everything around the graphs that runner.py / pipeline.py /
// host_numpy.py / windows.py / mmrope.py do in numpy or torch, in the same float32 operation
// order (no FMA contraction: this file is compiled with -ffp-contract=off), so that a step that
// is bit-exact in Python stays bit-exact here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ncnnport/seedvr2_npy.h"

namespace ncnnport::seedvr2 {

using Tensor = FloatArray;  // shape + C-order float32 data

Tensor zeros(std::vector<int64_t> shape);

// The fields of model.json["config"] the host needs (config.SeedVR2Config); missing ones are an
// error naming model.json and the field.
struct Config {
    int vid_in_channels = 0, vid_out_channels = 0, vid_dim = 0, heads = 0, head_dim = 0, num_layers = 0;
    int sinusoidal_dim = 0, window_area = 0, window_max_t = 0;
    std::array<int, 3> window{};
    double rope_theta = 0;
    int latent_channels = 0, decode_stages = 0;
    std::vector<int> temporal_down_blocks;
    double scaling_factor = 0, timestep = 0, schedule_T = 0;
    int text_len = 0;

    int spatial_factor() const { return 1 << (decode_stages - 1); }
    int temporal_factor() const { return 1 << static_cast<int>(temporal_down_blocks.size()); }
    int rope_axis_dim() const { return head_dim / 3 - (head_dim / 3) % 2; }
    // Whether the upsample after decoder stage k is space-time (runner.decode_stage_temporal).
    bool decode_temporal(int k) const;
    int latent_frames(int frames) const { return (frames - 1) / temporal_factor() + 1; }
};

Config config_from_model_json(const nlohmann::json& model, const std::string& source);

// --- preprocessing (pipeline.preprocess) --------------------------------------------------
std::pair<int, int> area_size(int h, int w, int64_t area);
int centre_offset(int size, int crop);
// float32 (planes, H, W) -> (planes, height, width): ATen's antialiased bicubic (host_numpy).
Tensor resize_bicubic_aa(const Tensor& x, int height, int width);
// uint8 frames (T, H, W, 3) -> float32 (3, T', H', W') in [-1, 1]; throws on a too-small frame.
Tensor preprocess(const std::vector<uint8_t>& frames, int t, int h, int w, int64_t area, int multiple = 16);

// --- latent and Euler step (pipeline.posterior_latent / restore) ---------------------------
Tensor posterior_latent(const Tensor& mean, const Tensor& logvar, const Tensor* eps, double scale);
Tensor channels_last(const Tensor& x);   // (C, t, h, w) -> (t, h, w, C)
Tensor channels_first(const Tensor& x);  // (t, h, w, C) -> (C, t, h, w)
Tensor build_condition(const Tensor& x_T_cl, const Tensor& latent_cl);
Tensor euler_x0(const Tensor& x_T_cl, const Tensor& velocity, double timestep, double schedule_T);

// --- DiT host ops (runner.py) --------------------------------------------------------------
Tensor patchify(const Tensor& vid);                                   // (T,H,W,C) -> (1, T*h*w, 4C)
Tensor unpatchify(const Tensor& x, std::array<int, 3> grid, int c);   // (N, 4c) -> (T, 2h, 2w, c)
Tensor timestep_sinusoid(double t, int dim);                          // (1, dim)

struct Window {
    std::array<int, 3> start, stop;  // (t, h, w) half-open intervals of the patched grid
};
std::array<int, 3> window_sizes(std::array<int, 3> grid, std::array<int, 3> num, int area, int max_t);
std::vector<std::pair<int, int>> axis_intervals(int n, int size, bool shifted);
std::vector<Window> partition(std::array<int, 3> grid, bool shifted, const Config& cfg);

// One partition ready for the graphs: raster token indices per window and each token's
// window-local RoPE tables (1, N, head_dim) in rotate-half order with the signed sin.
struct Plan {
    std::vector<std::vector<int64_t>> index;
    Tensor cos_v, sin_v;
};
// ``swap_hw_positions`` exchanges the h and w positions (a test-only perturbation).
Plan make_plan(std::array<int, 3> grid, bool shifted, const Config& cfg, bool swap_hw_positions = false);
// Text tables (1, L, head_dim): text token i at (i, i, i).
std::pair<Tensor, Tensor> text_tables(int text_len, const Config& cfg);
// cos / signed-sin rows for integer (t, h, w) positions (mmrope.MMRoPE3d.tables + runner).
std::pair<Tensor, Tensor> rope_tables(const std::vector<std::array<int64_t, 3>>& pos, const Config& cfg);

// Rows of a (1, N, ...) tensor: gather / scatter along axis 1.
Tensor gather_rows(const Tensor& x, const std::vector<int64_t>& rows);
Tensor concat_rows(const Tensor& a, const Tensor& b);

// --- VAE decode host op and output (wrappers.depth_to_space, colour fix, uint8) -----------
Tensor depth_to_space(const Tensor& y, bool temporal);
Tensor wavelet_color_fix(const Tensor& output, const Tensor& source);  // both (3, T, H, W)
std::vector<uint8_t> to_uint8(const Tensor& x, int frames);            // -> (frames, H, W, 3)

}  // namespace ncnnport::seedvr2
