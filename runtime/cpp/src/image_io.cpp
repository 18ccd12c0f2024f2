// PNG through libpng's simplified API (png_image), JPEG through libjpeg with a longjmp error
// manager: neither library may print-and-exit on a bad file, every failure is an ImageError.
#include "ncnnport/image_io.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

namespace ncnnport {
namespace {

std::string lower_suffix(const std::filesystem::path& path) {
    std::string s = path.extension().string();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ImageError(path.string() + ": cannot open");
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw ImageError(path.string() + ": read error");
    return bytes;
}

struct PngSource {
    const std::vector<uint8_t>* bytes;
    size_t offset;
};

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
    auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
    if (src->offset + n > src->bytes->size()) png_error(png, "truncated file");
    std::memcpy(out, src->bytes->data() + src->offset, n);
    src->offset += n;
}

void png_fail(png_structp png, png_const_charp msg) {
    auto* message = static_cast<std::string*>(png_get_error_ptr(png));
    *message = msg;
    png_longjmp(png, 1);
}

void png_silent(png_structp, png_const_charp) {}

// The low-level API, not png_image: the simplified API applies gAMA/sRGB conversions that PIL
// does not. Transforms: palette -> RGB, grey -> RGB, 16 -> 8 bit (high byte), alpha stripped.
// Everything that may longjmp is in here; the caller owns the png structs.
bool png_decode_into(png_structp png, png_infop info, PngSource* src, std::vector<uint8_t>* rgb,
                     std::vector<png_bytep>* rows, int* width, int* height, std::string* bomb) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_set_read_fn(png, src, png_read_mem);
    png_set_user_limits(png, 1u << 30, 1u << 30);
    png_read_info(png, info);
    const int64_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (w <= 0 || h <= 0 || w * h > kMaxImagePixels) {
        *bomb = std::to_string(w) + "x" + std::to_string(h);
        return false;
    }
    const int colour = png_get_color_type(png, info);
    if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (colour == PNG_COLOR_TYPE_GRAY || colour == PNG_COLOR_TYPE_GRAY_ALPHA) {
        png_set_expand_gray_1_2_4_to_8(png);
        png_set_gray_to_rgb(png);
    }
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != static_cast<size_t>(w) * 3) png_error(png, "unsupported pixel layout");
    *width = static_cast<int>(w);
    *height = static_cast<int>(h);
    rgb->resize(static_cast<size_t>(w) * h * 3);
    rows->resize(static_cast<size_t>(h));
    for (int64_t y = 0; y < h; ++y) (*rows)[static_cast<size_t>(y)] = rgb->data() + static_cast<size_t>(y) * w * 3;
    png_read_image(png, rows->data());
    png_read_end(png, nullptr);
    return true;
}

RgbImage decode_png(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
    std::string message;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &message, png_fail, png_silent);
    png_infop info = png ? png_create_info_struct(png) : nullptr;
    if (!png || !info) {
        png_destroy_read_struct(&png, &info, nullptr);
        throw ImageError(path.string() + ": libpng could not start");
    }
    PngSource src{&bytes, 0};
    RgbImage out;
    std::string bomb;
    std::vector<png_bytep> rows;
    const bool ok = png_decode_into(png, info, &src, &out.rgb, &rows, &out.width, &out.height, &bomb);
    png_destroy_read_struct(&png, &info, nullptr);
    if (!bomb.empty()) throw ImageError(path.string() + ": refused as a decompression bomb or empty (" + bomb + " pixels)");
    if (!ok) throw ImageError(path.string() + ": cannot decode as an image (" + message + ")");
    return out;
}

struct JpegError {
    jpeg_error_mgr mgr;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

void jpeg_silent(j_common_ptr, int) {}

// Everything that may longjmp lives in this function, with no C++ objects needing unwinding
// between setjmp and the jump (the output buffer is allocated by the caller).
bool jpeg_decode_into(jpeg_decompress_struct* cinfo, JpegError* err, const std::vector<uint8_t>& bytes,
                      std::vector<uint8_t>* rgb, int* width, int* height, const std::filesystem::path& path,
                      std::string* bomb) {
    if (setjmp(err->jump)) return false;
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(cinfo, TRUE);
    cinfo->out_color_space = JCS_RGB;  // grey and YCbCr to RGB as PIL's convert("RGB")
    jpeg_calc_output_dimensions(cinfo);
    const int64_t w = cinfo->output_width, h = cinfo->output_height;
    if (w <= 0 || h <= 0 || w * h > kMaxImagePixels) {
        *bomb = path.string() + ": refused as a decompression bomb or empty (" + std::to_string(w) + "x" +
                std::to_string(h) + " pixels)";
        return false;
    }
    jpeg_start_decompress(cinfo);
    *width = static_cast<int>(cinfo->output_width);
    *height = static_cast<int>(cinfo->output_height);
    rgb->resize(static_cast<size_t>(*width) * *height * 3);
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW row = rgb->data() + static_cast<size_t>(cinfo->output_scanline) * *width * 3;
        jpeg_read_scanlines(cinfo, &row, 1);
    }
    jpeg_finish_decompress(cinfo);
    return true;
}

RgbImage decode_jpeg(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
    jpeg_decompress_struct cinfo;
    JpegError err;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    err.mgr.emit_message = jpeg_silent;
    err.message[0] = '\0';
    RgbImage out;
    std::string bomb;
    const bool ok = jpeg_decode_into(&cinfo, &err, bytes, &out.rgb, &out.width, &out.height, path, &bomb);
    jpeg_destroy_decompress(&cinfo);
    if (!bomb.empty()) throw ImageError(bomb);
    if (!ok) throw ImageError(path.string() + ": cannot decode as an image (" + err.message + ")");
    return out;
}

}  // namespace

bool is_image_suffix(const std::filesystem::path& path) {
    const std::string s = lower_suffix(path);
    return s == ".png" || s == ".jpg" || s == ".jpeg";
}

RgbImage read_image(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) throw ImageError(path.string() + ": no such file");
    const std::vector<uint8_t> bytes = read_bytes(path);
    static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return decode_png(path, bytes);
    if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return decode_jpeg(path, bytes);
    throw ImageError(path.string() + ": cannot decode as an image (not a PNG or JPEG file)");
}

void write_png(const std::filesystem::path& path, const RgbImage& image) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = static_cast<png_uint_32>(image.width);
    img.height = static_cast<png_uint_32>(image.height);
    img.format = PNG_FORMAT_RGB;
    if (!png_image_write_to_file(&img, path.string().c_str(), 0, image.rgb.data(), 0, nullptr))
        throw ImageError(path.string() + ": cannot write PNG (" + img.message + ")");
}

}  // namespace ncnnport
