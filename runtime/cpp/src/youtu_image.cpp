#include "ncnnport/youtu_image.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ncnnport::youtu {
namespace {

constexpr uint16_t kOrientationTag = 0x0112;

std::vector<uint8_t> file_bytes(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ImageError(path.string() + ": cannot open");
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Orientation from a TIFF block ("II*\0" / "MM\0*" header, IFD0); 1 when absent or malformed.
int tiff_orientation(const uint8_t* p, size_t n) {
    if (n < 8) return 1;
    const bool le = p[0] == 'I' && p[1] == 'I';
    if (!le && !(p[0] == 'M' && p[1] == 'M')) return 1;
    auto u16 = [&](size_t at) -> uint32_t { return le ? p[at] | p[at + 1] << 8 : p[at] << 8 | p[at + 1]; };
    auto u32 = [&](size_t at) -> uint32_t {
        return le ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
    };
    if (u16(2) != 42) return 1;
    const size_t ifd = u32(4);
    if (ifd + 2 > n) return 1;
    const uint32_t entries = u16(ifd);
    for (uint32_t i = 0; i < entries; ++i) {
        const size_t e = ifd + 2 + 12 * static_cast<size_t>(i);
        if (e + 12 > n) return 1;
        if (u16(e) != kOrientationTag) continue;
        const uint32_t type = u16(e + 2);
        if (type == 3) return static_cast<int>(u16(e + 8));  // SHORT
        if (type == 4) return static_cast<int>(u32(e + 8));  // LONG
        return 1;
    }
    return 1;
}

int jpeg_orientation(const std::vector<uint8_t>& b) {
    size_t at = 2;  // after SOI
    while (at + 4 <= b.size() && b[at] == 0xFF) {
        const uint8_t marker = b[at + 1];
        if (marker == 0xDA || marker == 0xD9) break;  // start of scan / end of image
        const size_t len = static_cast<size_t>(b[at + 2]) << 8 | b[at + 3];
        if (len < 2 || at + 2 + len > b.size()) break;
        const uint8_t* seg = b.data() + at + 4;
        if (marker == 0xE1 && len >= 8 && std::memcmp(seg, "Exif\0\0", 6) == 0) return tiff_orientation(seg + 6, len - 8);
        at += 2 + len;
    }
    return 1;
}

int png_orientation(const std::vector<uint8_t>& b) {
    size_t at = 8;  // after the signature
    while (at + 12 <= b.size()) {
        const size_t len = static_cast<size_t>(b[at]) << 24 | b[at + 1] << 16 | b[at + 2] << 8 | b[at + 3];
        if (at + 12 + len > b.size()) break;
        const uint8_t* type = b.data() + at + 4;
        const uint8_t* data = b.data() + at + 8;
        if (std::memcmp(type, "eXIf", 4) == 0) {
            if (len >= 6 && std::memcmp(data, "Exif\0\0", 6) == 0) return tiff_orientation(data + 6, len - 6);
            return tiff_orientation(data, len);
        }
        if (std::memcmp(type, "IDAT", 4) == 0 || std::memcmp(type, "IEND", 4) == 0) break;
        at += 12 + len;
    }
    return 1;
}

}  // namespace

int exif_orientation(const std::filesystem::path& path) {
    const std::vector<uint8_t> b = file_bytes(path);
    if (b.size() >= 4 && b[0] == 0xFF && b[1] == 0xD8) return jpeg_orientation(b);
    static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return png_orientation(b);
    return 1;
}

RgbImage apply_orientation(const RgbImage& image, int orientation) {
    if (orientation < 2 || orientation > 8) return image;
    const int w = image.width, h = image.height;
    const bool swap = orientation >= 5;  // TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90 swap the sides
    RgbImage out;
    out.width = swap ? h : w;
    out.height = swap ? w : h;
    out.rgb.resize(image.rgb.size());
    for (int y = 0; y < out.height; ++y)
        for (int x = 0; x < out.width; ++x) {
            int sx = x, sy = y;
            switch (orientation) {
                case 2: sx = w - 1 - x; break;                      // FLIP_LEFT_RIGHT
                case 3: sx = w - 1 - x; sy = h - 1 - y; break;      // ROTATE_180
                case 4: sy = h - 1 - y; break;                      // FLIP_TOP_BOTTOM
                case 5: sx = y; sy = x; break;                      // TRANSPOSE
                case 6: sx = y; sy = h - 1 - x; break;              // ROTATE_270 (clockwise)
                case 7: sx = w - 1 - y; sy = h - 1 - x; break;      // TRANSVERSE
                case 8: sx = w - 1 - y; sy = x; break;              // ROTATE_90 (counter-clockwise)
            }
            std::memcpy(out.rgb.data() + (static_cast<size_t>(y) * out.width + x) * 3,
                        image.rgb.data() + (static_cast<size_t>(sy) * w + sx) * 3, 3);
        }
    return out;
}

RgbImage load_upright(const std::filesystem::path& path) {
    RgbImage image = read_image(path);
    return apply_orientation(image, exif_orientation(path));
}

}  // namespace ncnnport::youtu
