#include "ncnnport/npz.h"

#include <zip.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <memory>

namespace ncnnport {
namespace {

constexpr unsigned char kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr int64_t kMaxMember = int64_t(1) << 34;  // 16 GiB: beyond any graph's golden tensor

struct DtypeInfo {
    const char* name;
    size_t itemsize;
};

// numpy descr -> our dtype; nullptr name = refused. Unicode '<Un' is handled by the caller.
DtypeInfo numeric_dtype(const std::string& descr) {
    if (descr == "<f4") return {"float32", 4};
    if (descr == "<i4") return {"int32", 4};
    if (descr == "<i8") return {"int64", 8};
    if (descr == "<f8") return {"float64", 8};
    if (descr == "|b1") return {"bool", 1};
    return {nullptr, 0};
}

// A cursor over the header dict literal, accepting exactly what numpy's format module writes.
class HeaderParser {
public:
    HeaderParser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

    void expect(char c) {
        skip_spaces();
        if (pos_ >= s_.size() || s_[pos_] != c) fail(std::string("expected '") + c + "'");
        ++pos_;
    }
    bool peek(char c) {
        skip_spaces();
        return pos_ < s_.size() && s_[pos_] == c;
    }
    std::string quoted() {
        skip_spaces();
        if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) fail("expected a quoted string");
        const char q = s_[pos_++];
        const size_t end = s_.find(q, pos_);
        if (end == std::string::npos) fail("unterminated string");
        std::string out = s_.substr(pos_, end - pos_);
        pos_ = end + 1;
        return out;
    }
    bool boolean() {
        skip_spaces();
        for (const char* word : {"True", "False"}) {
            if (s_.compare(pos_, std::strlen(word), word) == 0) {
                pos_ += std::strlen(word);
                return word[0] == 'T';
            }
        }
        fail("expected True or False");
        return false;
    }
    std::vector<int64_t> shape() {
        std::vector<int64_t> dims;
        expect('(');
        while (!peek(')')) {
            skip_spaces();
            size_t start = pos_;
            while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
            if (start == pos_ || pos_ - start > 18) fail("bad shape entry");
            dims.push_back(std::stoll(s_.substr(start, pos_ - start)));
            if (!peek(')')) expect(',');
        }
        expect(')');
        return dims;
    }
    void end() {
        skip_spaces();
        if (pos_ != s_.size()) fail("trailing characters after the header dict");
    }
    [[noreturn]] void fail(const std::string& why) const {
        throw NpzError(what_ + ": bad .npy header (" + why + ")");
    }

private:
    void skip_spaces() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    }
    const std::string& s_;
    const std::string& what_;
    size_t pos_ = 0;
};

struct Header {
    std::string descr;
    bool fortran = false;
    std::vector<int64_t> shape;
};

Header parse_header(const std::string& text, const std::string& what) {
    HeaderParser p(text, what);
    Header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    p.expect('{');
    while (!p.peek('}')) {
        const std::string key = p.quoted();
        p.expect(':');
        bool* seen = nullptr;
        if (key == "descr") {
            if (p.peek('[') || p.peek('{')) p.fail("structured dtype refused");
            h.descr = p.quoted();
            seen = &seen_descr;
        } else if (key == "fortran_order") {
            h.fortran = p.boolean();
            seen = &seen_order;
        } else if (key == "shape") {
            h.shape = p.shape();
            seen = &seen_shape;
        } else {
            p.fail("unexpected key '" + key + "'");
        }
        if (*seen) p.fail("key '" + key + "' twice");
        *seen = true;
        if (!p.peek('}')) p.expect(',');
    }
    p.expect('}');
    p.end();
    if (!seen_descr || !seen_order || !seen_shape) p.fail("needs descr, fortran_order and shape");
    return h;
}

// UTF-32LE code units -> UTF-8, trailing NULs dropped (numpy pads '<Un' strings with them).
std::string utf32_to_utf8(const unsigned char* p, size_t n_chars, const std::string& what) {
    std::string out;
    size_t len = n_chars;
    auto unit = [p](size_t i) {
        return uint32_t(p[4 * i]) | uint32_t(p[4 * i + 1]) << 8 | uint32_t(p[4 * i + 2]) << 16 |
               uint32_t(p[4 * i + 3]) << 24;
    };
    while (len > 0 && unit(len - 1) == 0) --len;
    for (size_t i = 0; i < len; ++i) {
        const uint32_t c = unit(i);
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) throw NpzError(what + ": invalid character in a string array");
        if (c < 0x80) {
            out += char(c);
        } else if (c < 0x800) {
            out += char(0xC0 | (c >> 6));
            out += char(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out += char(0xE0 | (c >> 12));
            out += char(0x80 | ((c >> 6) & 0x3F));
            out += char(0x80 | (c & 0x3F));
        } else {
            out += char(0xF0 | (c >> 18));
            out += char(0x80 | ((c >> 12) & 0x3F));
            out += char(0x80 | ((c >> 6) & 0x3F));
            out += char(0x80 | (c & 0x3F));
        }
    }
    return out;
}

int64_t element_count(const std::vector<int64_t>& shape, const std::string& what) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) throw NpzError(what + ": shape overflows");
        n *= d;
    }
    return n;
}

}  // namespace

int64_t NpyArray::size() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

NpyArray parse_npy(const std::vector<unsigned char>& bytes, const std::string& what) {
    if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
        throw NpzError(what + ": not a .npy array (bad magic)");
    const unsigned major = bytes[6];
    size_t header_len = 0, offset = 0;
    if (major == 1) {
        header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8;
        offset = 10;
    } else if (major == 2 || major == 3) {
        if (bytes.size() < 12) throw NpzError(what + ": truncated .npy header");
        header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
        offset = 12;
    } else {
        throw NpzError(what + ": unsupported .npy version " + std::to_string(major));
    }
    if (bytes.size() < offset + header_len) throw NpzError(what + ": truncated .npy header");
    std::string text(bytes.begin() + offset, bytes.begin() + offset + header_len);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const Header h = parse_header(text, what);
    if (h.descr == "|O" || h.descr == "O" || h.descr == "<O")
        throw NpzError(what + ": object array refused (numpy would unpickle it)");
    if (h.fortran) throw NpzError(what + ": Fortran-order array refused (golden vectors are C order)");
    NpyArray arr;
    arr.shape = h.shape;
    const int64_t count = element_count(h.shape, what);
    size_t itemsize = 0;
    bool is_str = false;
    if (h.descr.size() > 2 && h.descr.compare(0, 2, "<U") == 0 &&
        h.descr.find_first_not_of("0123456789", 2) == std::string::npos && h.descr.size() < 12) {
        arr.dtype = "str";
        itemsize = 4 * std::stoull(h.descr.substr(2));
        is_str = true;
    } else {
        const DtypeInfo info = numeric_dtype(h.descr);
        if (!info.name) throw NpzError(what + ": dtype '" + h.descr + "' not supported (little-endian float32/int32/int64/float64/bool/str only)");
        arr.dtype = info.name;
        itemsize = info.itemsize;
    }
    const size_t payload = bytes.size() - offset - header_len;
    if (itemsize == 0 || uint64_t(count) > payload / itemsize || uint64_t(count) * itemsize != payload)
        throw NpzError(what + ": " + std::to_string(payload) + " data bytes, shape and dtype need " +
                       std::to_string(uint64_t(count) * itemsize) + " (truncated or padded)");
    const unsigned char* data = bytes.data() + offset + header_len;
    if (is_str) {
        for (int64_t i = 0; i < count; ++i) arr.strings.push_back(utf32_to_utf8(data + i * itemsize, itemsize / 4, what));
    } else {
        arr.data.assign(data, data + payload);
    }
    return arr;
}

namespace {

struct ZipCloser {
    void operator()(zip_t* z) const { zip_discard(z); }
};

std::vector<unsigned char> read_member(zip_t* z, zip_uint64_t index, const std::string& what) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z, index, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
        throw NpzError(what + ": cannot stat zip member");
    if (st.size > uint64_t(kMaxMember)) throw NpzError(what + ": member larger than 16 GiB refused");
    zip_file_t* f = zip_fopen_index(z, index, 0);
    if (!f) throw NpzError(what + ": cannot open zip member (" + zip_strerror(z) + ")");
    std::vector<unsigned char> out(st.size);
    zip_int64_t got = out.empty() ? 0 : zip_fread(f, out.data(), out.size());
    unsigned char extra;
    const zip_int64_t more = zip_fread(f, &extra, 1);
    const std::string err = got < 0 || more != 0 ? zip_file_strerror(f) : "";
    zip_fclose(f);
    if (got < 0 || uint64_t(got) != st.size || more != 0)
        throw NpzError(what + ": zip member truncated or corrupt" + (err.empty() ? "" : " (" + err + ")"));
    return out;
}

}  // namespace

std::map<std::string, NpyArray> read_npz(const std::filesystem::path& path) {
    const std::string file = path.string();
    int err = 0;
    std::unique_ptr<zip_t, ZipCloser> z(zip_open(file.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err));
    if (!z) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, err);
        const std::string why = zip_error_strerror(&ze);
        zip_error_fini(&ze);
        throw NpzError(file + ": not a readable .npz (" + why + ")");
    }
    std::map<std::string, NpyArray> out;
    const zip_int64_t n = zip_get_num_entries(z.get(), 0);
    for (zip_int64_t i = 0; i < n; ++i) {
        const char* raw = zip_get_name(z.get(), zip_uint64_t(i), 0);
        const std::string name = raw ? raw : "";
        if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".npy") != 0)
            throw NpzError(file + ": member '" + name + "' is not a .npy array");
        const std::string key = name.substr(0, name.size() - 4);
        const std::string what = file + ": " + key;
        if (out.count(key)) throw NpzError(what + ": member twice");
        out.emplace(key, parse_npy(read_member(z.get(), zip_uint64_t(i), what), what));
    }
    return out;
}

}  // namespace ncnnport
