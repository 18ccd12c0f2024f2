// Package manifest check: the C++ twin of ncnnport.convert.manifest.check_package.
//
// manifest.json lists {"files": {"relative/path": {"sha256": hex, "size": bytes}}}. A package
// matches when every listed file exists inside the folder with that size and sha256, no listed
// path is unsafe (absolute, "..", backslash, "~") or a link leaving the folder, and no file is
// present that the manifest does not list (dot-files and manifest.json itself excepted).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ncnnport {

inline constexpr const char* kManifestName = "manifest.json";

struct ManifestCheck {
    std::vector<std::string> problems;  // one line each, naming the file; empty when it matches
    size_t files_checked = 0;           // listed files whose size and sha256 were compared
};

// Never throws for package content (missing files, bad JSON, wrong types are problems); throws
// only IoError for a file that exists but cannot be read.
ManifestCheck check_package(const std::filesystem::path& root);

}  // namespace ncnnport
