// PNG / JPEG frames in and PNG frames out, through Debian's libpng and libjpeg(-turbo).
//
// Decoding follows what the Python loop does (PIL ``Image.open(path).convert("RGB")``) for the
// common cases: 8-bit RGB / RGBA / grey / palette PNGs and 8-bit JPEGs decode to the same bytes
// (PNG is lossless; PIL and Debian both decode JPEG with libjpeg-turbo's default islow IDCT).
// Alpha is dropped as convert("RGB") drops it; 16-bit PNG samples keep their high byte.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

// A file that is missing, not an image, truncated or too large: one line naming the file.
class ImageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct RgbImage {
    int width = 0;
    int height = 0;
    std::vector<uint8_t> rgb;  // height * width * 3, row-major, RGB
};

// Largest accepted image, in pixels: PIL's decompression-bomb error limit (2 x 89478485).
inline constexpr int64_t kMaxImagePixels = 2LL * 89478485LL;

// Decodes a .png / .jpg / .jpeg by its content (signature), not its name.
RgbImage read_image(const std::filesystem::path& path);

// Writes an 8-bit RGB PNG; throws ImageError naming the file when it cannot be written.
void write_png(const std::filesystem::path& path, const RgbImage& image);

// The file names read_image accepts by suffix (lower-case, with the dot).
bool is_image_suffix(const std::filesystem::path& path);

}  // namespace ncnnport
