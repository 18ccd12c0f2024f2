// .npy and .npz (numpy.savez: stored, uncompressed zip members) readers for float32 arrays:
// the SeedVR2 package's text embedding (assets/text_embedding.npy) and a case's noise.npz.
//
// Only what numpy writes for plain numeric arrays is accepted: '<f4' little-endian, C order,
// format 1.0/2.0/3.0 headers; zip members stored (method 0) with or without zip64 fields.
// Anything else (pickled objects, compressed npz, Fortran order) is refused, naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

class NpyError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct FloatArray {
    std::vector<int64_t> shape;
    std::vector<float> data;  // C order
    int64_t numel() const;
};

// Parses one .npy image held in memory; ``what`` names it in errors ("noise.npz:x_T").
FloatArray parse_npy(const std::string& bytes, const std::string& what);

FloatArray read_npy(const std::filesystem::path& path);

// Writes ``a`` as a version-1.0 '<f4' C-order .npy (stage dumps for debugging and tests).
void write_npy(const std::filesystem::path& path, const FloatArray& a);

// Every member of an .npz (float32 arrays), keyed by name without the ".npy" suffix. Not named
// read_npz: npz.h's read_npz (golden vectors) has the same parameters, and a return type is not
// part of the mangled name, so the two collided at link time once one executable used both.
std::map<std::string, FloatArray> read_float_npz(const std::filesystem::path& path);

}  // namespace ncnnport
