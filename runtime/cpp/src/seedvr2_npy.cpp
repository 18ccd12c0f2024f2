// numpy's formats, read by their published layout: NPY magic + header dict; a zip's end of
// central directory, central entries (zip64 extra field 0x0001 when a field is 0xFFFFFFFF) and
// local headers.
#include "ncnnport/seedvr2_npy.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

namespace ncnnport {
namespace {

std::string slurp(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw NpyError(path.string() + ": cannot open");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw NpyError(path.string() + ": read error");
    return bytes;
}

uint64_t le(const std::string& b, size_t at, int n, const std::string& what) {
    if (at + static_cast<size_t>(n) > b.size()) throw NpyError(what + ": truncated");
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + static_cast<size_t>(i)]);
    return v;
}

std::vector<int64_t> parse_shape(const std::string& header, const std::string& what) {
    std::smatch m;
    if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
        throw NpyError(what + ": npy header has no shape");
    std::vector<int64_t> shape;
    const std::string inner = m[1];
    const std::regex num(R"(\d+)");
    for (auto it = std::sregex_iterator(inner.begin(), inner.end(), num); it != std::sregex_iterator(); ++it)
        shape.push_back(std::stoll(it->str()));
    return shape;
}

struct ZipEntry {
    std::string name;
    uint64_t offset = 0, size = 0, csize = 0;
    int method = 0;
};

// Overrides 0xFFFFFFFF fields from a zip64 extended-information extra field (in APPNOTE order).
void apply_zip64(const std::string& b, size_t extra, size_t extra_len, ZipEntry* e, bool size_max, bool csize_max,
                 bool offset_max, const std::string& what) {
    for (size_t p = extra; p + 4 <= extra + extra_len;) {
        const uint64_t id = le(b, p, 2, what), len = le(b, p + 2, 2, what);
        if (id == 0x0001) {
            size_t q = p + 4;
            if (size_max) e->size = le(b, q, 8, what), q += 8;
            if (csize_max) e->csize = le(b, q, 8, what), q += 8;
            if (offset_max) e->offset = le(b, q, 8, what);
            return;
        }
        p += 4 + len;
    }
}

std::vector<ZipEntry> central_directory(const std::string& b, const std::string& what) {
    if (b.size() < 22) throw NpyError(what + ": not a zip/npz file");
    size_t eocd = std::string::npos;
    for (size_t p = b.size() - 22 + 1; p-- > 0 && b.size() - p <= 22 + 65535;)
        if (le(b, p, 4, what) == 0x06054b50) {
            eocd = p;
            break;
        }
    if (eocd == std::string::npos) throw NpyError(what + ": not a zip/npz file (no end of central directory)");
    uint64_t count = le(b, eocd + 10, 2, what), cd = le(b, eocd + 16, 4, what);
    if ((count == 0xFFFF || cd == 0xFFFFFFFF) && eocd >= 20 && le(b, eocd - 20, 4, what) == 0x07064b50) {
        const uint64_t z64 = le(b, eocd - 20 + 8, 8, what);
        if (le(b, z64, 4, what) != 0x06064b50) throw NpyError(what + ": bad zip64 end record");
        count = le(b, z64 + 32, 8, what);
        cd = le(b, z64 + 48, 8, what);
    }
    std::vector<ZipEntry> out;
    size_t p = cd;
    for (uint64_t i = 0; i < count; ++i) {
        if (le(b, p, 4, what) != 0x02014b50) throw NpyError(what + ": bad zip central directory");
        ZipEntry e;
        e.method = static_cast<int>(le(b, p + 10, 2, what));
        e.csize = le(b, p + 20, 4, what);
        e.size = le(b, p + 24, 4, what);
        const size_t nlen = le(b, p + 28, 2, what), xlen = le(b, p + 30, 2, what), clen = le(b, p + 32, 2, what);
        e.offset = le(b, p + 42, 4, what);
        if (p + 46 + nlen > b.size()) throw NpyError(what + ": truncated");
        e.name = b.substr(p + 46, nlen);
        apply_zip64(b, p + 46 + nlen, xlen, &e, e.size == 0xFFFFFFFF, e.csize == 0xFFFFFFFF,
                    e.offset == 0xFFFFFFFF, what);
        out.push_back(e);
        p += 46 + nlen + xlen + clen;
    }
    return out;
}

std::string member_bytes(const std::string& b, const ZipEntry& e, const std::string& what) {
    const std::string where = what + ":" + e.name;
    if (e.method != 0) throw NpyError(where + ": compressed member (method " + std::to_string(e.method) +
                                      "); write the npz with numpy.savez, not savez_compressed");
    if (le(b, e.offset, 4, where) != 0x04034b50) throw NpyError(where + ": bad zip local header");
    const size_t start = e.offset + 30 + le(b, e.offset + 26, 2, where) + le(b, e.offset + 28, 2, where);
    if (start + e.csize > b.size()) throw NpyError(where + ": truncated");
    return b.substr(start, e.csize);
}

}  // namespace

int64_t FloatArray::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

FloatArray parse_npy(const std::string& b, const std::string& what) {
    if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) throw NpyError(what + ": not an .npy array");
    const int major = static_cast<uint8_t>(b[6]);
    const size_t hlen = major == 1 ? le(b, 8, 2, what) : le(b, 8, 4, what);
    const size_t hstart = major == 1 ? 10 : 12;
    if (hstart + hlen > b.size()) throw NpyError(what + ": truncated npy header");
    const std::string header = b.substr(hstart, hlen);
    if (header.find("'descr': '<f4'") == std::string::npos)
        throw NpyError(what + ": dtype is not little-endian float32 ('<f4'): " + header);
    if (header.find("'fortran_order': False") == std::string::npos)
        throw NpyError(what + ": Fortran-order array; expected C order");
    FloatArray a;
    a.shape = parse_shape(header, what);
    const size_t nbytes = static_cast<size_t>(a.numel()) * 4;
    if (hstart + hlen + nbytes != b.size())
        throw NpyError(what + ": " + std::to_string(b.size() - hstart - hlen) + " data bytes, shape needs " +
                       std::to_string(nbytes));
    a.data.resize(static_cast<size_t>(a.numel()));
    std::memcpy(a.data.data(), b.data() + hstart + hlen, nbytes);
    return a;
}

FloatArray read_npy(const std::filesystem::path& path) { return parse_npy(slurp(path), path.string()); }

void write_npy(const std::filesystem::path& path, const FloatArray& a) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (size_t i = 0; i < a.shape.size(); ++i) header += std::to_string(a.shape[i]) + (a.shape.size() == 1 || i + 1 < a.shape.size() ? ", " : "");
    header += "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream out(path, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t n = static_cast<uint16_t>(header.size());
    const char len[2] = {static_cast<char>(n & 0xff), static_cast<char>(n >> 8)};
    out.write(len, 2);
    out << header;
    out.write(reinterpret_cast<const char*>(a.data.data()), static_cast<std::streamsize>(a.data.size() * 4));
    if (!out) throw NpyError(path.string() + ": cannot write");
}

std::map<std::string, FloatArray> read_float_npz(const std::filesystem::path& path) {
    const std::string b = slurp(path);
    std::map<std::string, FloatArray> out;
    for (const ZipEntry& e : central_directory(b, path.string())) {
        std::string key = e.name;
        if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
        out[key] = parse_npy(member_bytes(b, e, path.string()), path.string() + ":" + e.name);
    }
    return out;
}

}  // namespace ncnnport
