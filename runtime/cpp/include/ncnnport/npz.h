// Reading numpy .npz archives (np.savez: a zip of .npy files) without Python.
//
// Why strict: golden vectors come from a package a user downloaded. The .npy header is a Python
// dict literal; only the exact subset numpy writes is accepted ('descr', 'fortran_order', 'shape'),
// only little-endian numeric, bool and unicode dtypes are read, and object arrays ('|O', which
// numpy would unpickle) are refused. Every error is one NpzError line naming the file and member.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

class NpzError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// One array: dtype as numpy names it ("float32", "int32", "int64", "float64", "bool", "str"),
// C-order shape, and the raw little-endian bytes (or, for "str", the decoded UTF-8 strings).
struct NpyArray {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> data;
    std::vector<std::string> strings;

    int64_t size() const;  // element count (1 for a 0-d array)
};

// Parse one .npy file's bytes; `what` names it in errors ("golden/x.npz: case0/in0").
NpyArray parse_npy(const std::vector<unsigned char>& bytes, const std::string& what);

// Every member of an .npz, keyed as np.load keys them (the member name without ".npy").
std::map<std::string, NpyArray> read_npz(const std::filesystem::path& path);

}  // namespace ncnnport
