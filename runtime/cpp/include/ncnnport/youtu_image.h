// An image file read upright, as transformers' load_image does it (what Youtu-VL's processor
// sees): PIL.ImageOps.exif_transpose, then convert("RGB").
//
// Why here: image_io decodes pixels as stored; a phone JPEG tagged "rotate 90" must reach the
// model rotated, or the C++ and Python loops see different images. The orientation tag (0x0112
// of IFD0) is read from a JPEG's APP1 "Exif" segment or a PNG's eXIf chunk, and applied with
// PIL's Transpose meaning for each value 2..8; other values leave the image as stored.
#pragma once

#include <filesystem>

#include "ncnnport/image_io.h"

namespace ncnnport::youtu {

// EXIF orientation of the file (1 when there is none or it cannot be read).
int exif_orientation(const std::filesystem::path& path);

// `image` transformed as exif_transpose does for `orientation` (2..8; anything else: unchanged).
RgbImage apply_orientation(const RgbImage& image, int orientation);

// read_image + apply_orientation(exif_orientation): ImageError naming the file on a bad image.
RgbImage load_upright(const std::filesystem::path& path);

}  // namespace ncnnport::youtu
