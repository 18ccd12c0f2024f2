// sha256 of a file, through OpenSSL's libcrypto (EVP interface): the digest the Python side
// writes into manifest.json (ncnnport.fsutil.sha256_file), as lower-case hex.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

namespace ncnnport {

// Raised when a file cannot be read or the digest fails; the message names the file.
class IoError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Lower-case hex sha256 of the file's bytes, read in 1 MiB blocks (packages hold GB files).
std::string sha256_file(const std::filesystem::path& path);

// Lower-case hex sha256 of a byte string (tests and small buffers).
std::string sha256_bytes(const std::string& data);

}  // namespace ncnnport
