#include "ncnnport/manifest.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <system_error>

#include "ncnnport/sha256.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ncnnport {
namespace {

// Same rule as the Python side (_unsafe): absolute, "..", backslash or "~" prefix.
bool unsafe_path(const std::string& rel) {
    if (rel.empty() || rel[0] == '/' || rel[0] == '~' || rel.find('\\') != std::string::npos) return true;
    for (const auto& part : fs::path(rel)) {
        if (part == "..") return true;
    }
    return false;
}

bool inside(const fs::path& child, const fs::path& root) {
    auto r = root.begin();
    auto c = child.begin();
    for (; r != root.end(); ++r, ++c) {
        if (c == child.end() || *r != *c) return false;
    }
    return true;
}

bool hidden_relative(const fs::path& rel) {
    for (const auto& part : rel) {
        if (!part.empty() && part.string()[0] == '.') return true;
    }
    return false;
}

// Regular files under root (links to files count, as pathlib's is_file does), relative,
// skipping manifest.json at the top and any path with a part starting with '.'.
std::set<std::string> artifact_files(const fs::path& root) {
    std::set<std::string> out;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
        const fs::path rel = it->path().lexically_relative(root);
        if (hidden_relative(rel) || rel == kManifestName) continue;
        if (fs::is_regular_file(it->path(), ec)) out.insert(rel.generic_string());
    }
    return out;
}

// Parsed manifest.json or a problem line; "files" must be an object of objects.
bool read_files_table(const fs::path& path, json& files, std::vector<std::string>& problems) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        problems.push_back(path.string() + ": cannot open manifest");
        return false;
    }
    json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) {
        problems.push_back(path.string() + ": unreadable manifest (not valid JSON)");
        return false;
    }
    if (!doc.is_object() || !doc.contains("files")) {
        problems.push_back(path.string() + ": unreadable manifest (no \"files\" table)");
        return false;
    }
    if (!doc["files"].is_object()) {
        problems.push_back(path.string() + ": unreadable manifest (\"files\" is not an object)");
        return false;
    }
    files = doc["files"];
    return true;
}

// Checks one listed file; returns true when its size and sha256 were compared.
bool check_entry(const fs::path& root, const fs::path& resolved_root, const std::string& rel,
                 const json& meta, std::vector<std::string>& problems) {
    if (unsafe_path(rel)) {
        problems.push_back("unsafe path in manifest: '" + rel + "'");
        return false;
    }
    if (!meta.is_object() || !meta.contains("size") || !meta.contains("sha256")) {
        problems.push_back(rel + ": manifest entry needs \"size\" and \"sha256\"");
        return false;
    }
    const json& size = meta["size"];
    const json& digest = meta["sha256"];
    if (!size.is_number_integer() || !digest.is_string()) {
        problems.push_back(rel + ": manifest \"size\" must be an integer and \"sha256\" a string");
        return false;
    }
    const fs::path p = root / rel;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(p, ec)) || !inside(fs::weakly_canonical(p, ec), resolved_root)) {
        problems.push_back(rel + ": link or path leaving the package");
        return false;
    }
    if (!fs::is_regular_file(p, ec)) {
        problems.push_back(rel + ": missing");
        return false;
    }
    const auto actual = fs::file_size(p, ec);
    if (ec) {
        problems.push_back(rel + ": cannot read its size (" + ec.message() + ")");
    } else if (static_cast<long long>(actual) != size.get<long long>()) {
        problems.push_back(rel + ": size " + std::to_string(actual) + ", manifest " + size.dump());
    } else if (sha256_file(p) != digest.get<std::string>()) {
        problems.push_back(rel + ": sha256 differs from manifest");
    }
    return true;
}

}  // namespace

ManifestCheck check_package(const fs::path& root) {
    ManifestCheck result;
    const fs::path manifest = root / kManifestName;
    std::error_code ec;
    if (!fs::is_regular_file(manifest, ec)) {
        result.problems.push_back(manifest.string() + ": no manifest");
        return result;
    }
    json files;
    if (!read_files_table(manifest, files, result.problems)) return result;
    const fs::path resolved_root = fs::weakly_canonical(root, ec);
    for (const auto& [rel, meta] : files.items()) {
        if (check_entry(root, resolved_root, rel, meta, result.problems)) ++result.files_checked;
    }
    for (const auto& rel : artifact_files(root)) {
        if (!files.contains(rel)) result.problems.push_back(rel + ": extra file not in manifest");
    }
    return result;
}

}  // namespace ncnnport
