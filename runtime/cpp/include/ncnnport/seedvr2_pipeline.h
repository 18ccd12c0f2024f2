// The one-step SeedVR2 restoration over a package (pipeline.restore with runner.GraphBackend):
// preprocess -> VAE encode -> posterior latent -> DiT over windows -> Euler step -> VAE decode
// -> colour fix -> uint8 frames. Noise comes from the caller (a case's noise.npz): the official
// draws are torch's generator, which C++ does not reproduce.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ncnnport/seedvr2_graph.h"
#include "ncnnport/seedvr2_host.h"

namespace ncnnport::seedvr2 {

struct Frames {
    int t = 0, h = 0, w = 0;
    std::vector<uint8_t> rgb;  // (t, h, w, 3)
};

struct Noise {
    Tensor x_T;                       // (C, t, h, w)
    std::optional<Tensor> posterior;  // (C, t, h, w); absent: posterior mean
};

struct Timings {
    std::map<std::string, double> seconds;  // host steps, graph loads, graph runs, total
    std::vector<std::string> graphs;        // the graphs loaded, in load order (the run's JSON)
};

// Variations of the loop used by the tests to prove they would catch a broken runtime:
// each one is a bug C++ ports of this model have shipped. Never set outside tests.
struct Perturb {
    bool swap_shift = false;          // even blocks on the shifted windows, odd on the regular
    bool flip_rope_h_w = false;       // build RoPE tables with the h and w axes exchanged
};

class Pipeline {
public:
    Pipeline(std::filesystem::path package, const RunOptions& options);

    const Config& config() const { return cfg_; }
    // Latent (C, t, h, w) that preprocess + encoder give for these frames at ``area``.
    std::vector<int64_t> latent_shape(int t, int h, int w, int64_t area) const;
    // The package's area rule (model.json preprocessing.area) for an h x w input.
    int64_t default_area(int h, int w) const;

    Frames restore(const Frames& input, const Noise& noise, int64_t area, bool colour_fix, Timings* timings,
                   const Perturb& perturb = {});

    // When set, restore() writes each stage as <dir>/<stage>.npy, named as pipeline.restore's
    // ``stages`` dict (input, posterior_mean, latent, velocity, x0, decoded).
    void set_dump_dir(std::filesystem::path dir) { dump_dir_ = std::move(dir); }

private:
    Graph& graph(const std::string& name, Timings* timings);
    void release(const std::string& name) { graphs_.erase(name); }
    // The graph that runs VAE graph `name` on `frames` frames: its single-frame twin
    // (<name>_image, temporal taps summed at export: a third of the 3x3x3 convs' work) for one
    // frame when the package has it, else `name` (clips, and packages built before the twins).
    std::string vae_graph(const std::string& name, int64_t frames) const;
    Tensor dit(const Tensor& cond, Timings* timings, const Perturb& perturb);
    Tensor decode(const Tensor& z, Timings* timings);

    void dump(const std::string& stage, const Tensor& t) const;

    std::filesystem::path package_, dump_dir_;
    RunOptions options_;
    nlohmann::json model_;
    Config cfg_;
    Tensor text_;  // (1, L, txt_in)
    std::map<std::string, std::unique_ptr<Graph>> graphs_;
};

}  // namespace ncnnport::seedvr2
