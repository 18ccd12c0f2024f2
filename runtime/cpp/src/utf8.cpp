#include "ncnnport/utf8.h"

namespace ncnnport::utf8 {

void append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// Well-formed sequences per the Unicode standard's table of UTF-8 byte sequences: the lead
// byte fixes the length and the allowed range of the second byte; later bytes are 80..BF.
size_t valid_sequence(const std::string& s, size_t i, size_t& consumed) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char lead = b(i);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead < 0x80) { consumed = 1; return 1; }
    if (lead >= 0xC2 && lead <= 0xDF) len = 2;
    else if (lead == 0xE0) { len = 3; lo = 0xA0; }
    else if (lead >= 0xE1 && lead <= 0xEC) len = 3;
    else if (lead == 0xED) { len = 3; hi = 0x9F; }
    else if (lead >= 0xEE && lead <= 0xEF) len = 3;
    else if (lead == 0xF0) { len = 4; lo = 0x90; }
    else if (lead >= 0xF1 && lead <= 0xF3) len = 4;
    else if (lead == 0xF4) { len = 4; hi = 0x8F; }
    else { consumed = 1; return 0; }
    size_t k = 1;
    for (; k < len && i + k < s.size(); ++k) {
        const unsigned char lower = (k == 1) ? lo : 0x80, upper = (k == 1) ? hi : 0xBF;
        if (b(i + k) < lower || b(i + k) > upper) break;
    }
    consumed = k;
    return k == len ? len : 0;
}

char32_t decode_at(const std::string& s, size_t i, size_t len) {
    const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
    switch (len) {
        case 1: return b(0);
        case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    }
}

std::vector<std::string> chars(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        size_t consumed = 1;
        size_t len = valid_sequence(s, i, consumed);
        if (len == 0) len = consumed;  // callers pass valid text; never loop forever
        out.push_back(s.substr(i, len));
        i += len;
    }
    return out;
}

std::string lossy(const std::string& bytes) {
    std::string out;
    out.reserve(bytes.size());
    for (size_t i = 0; i < bytes.size();) {
        size_t consumed = 1;
        const size_t len = valid_sequence(bytes, i, consumed);
        if (len) {
            out.append(bytes, i, len);
            i += len;
        } else {
            append(out, 0xFFFD);
            i += consumed;
        }
    }
    return out;
}

}  // namespace ncnnport::utf8
