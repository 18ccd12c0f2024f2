#include "ncnnport/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <fstream>
#include <memory>
#include <vector>

namespace ncnnport {
namespace {

using MdCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

MdCtx new_sha256_ctx() {
    MdCtx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
        throw IoError("sha256: OpenSSL digest initialisation failed");
    return ctx;
}

std::string finish_hex(EVP_MD_CTX* ctx) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, digest.data(), &len) != 1)
        throw IoError("sha256: OpenSSL digest finalisation failed");
    static const char* hex = "0123456789abcdef";
    std::string out;
    out.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
        out.push_back(hex[digest[i] >> 4]);
        out.push_back(hex[digest[i] & 15]);
    }
    return out;
}

}  // namespace

std::string sha256_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(path.string() + ": cannot open for reading");
    MdCtx ctx = new_sha256_ctx();
    std::vector<char> block(1 << 20);
    while (in) {
        in.read(block.data(), static_cast<std::streamsize>(block.size()));
        const std::streamsize got = in.gcount();
        if (got > 0 && EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(got)) != 1)
            throw IoError(path.string() + ": sha256 update failed");
    }
    if (in.bad()) throw IoError(path.string() + ": read error");
    return finish_hex(ctx.get());
}

std::string sha256_bytes(const std::string& data) {
    MdCtx ctx = new_sha256_ctx();
    if (EVP_DigestUpdate(ctx.get(), data.data(), data.size()) != 1)
        throw IoError("sha256: update failed");
    return finish_hex(ctx.get());
}

}  // namespace ncnnport
