// Reading a package's JSON files (model.json, specs/*.spec.json) with errors that name the file
// and the field, never a nlohmann exception text or a crash.
//
// Why: every executable reads its dims, ids and blob names from the package, and a package
// written by another version must fail in one line ("model.json: field 'dims.hidden' missing"),
// not deep in a graph call.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace ncnnport {

// A package file is missing, unreadable, not JSON, or lacks/mistypes a field.
class PackageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class JsonFile {
public:
    // Throws PackageError naming `path` when it is missing, unreadable or not a JSON object.
    static JsonFile load(const std::filesystem::path& path);

    // The value at a dotted path ("dims.hidden"); PackageError naming file and field if absent.
    const nlohmann::json& at(const std::string& dotted) const;
    bool has(const std::string& dotted) const;
    int64_t integer(const std::string& dotted) const;
    double number(const std::string& dotted) const;
    std::string string(const std::string& dotted) const;
    std::vector<int64_t> integers(const std::string& dotted) const;

    const std::filesystem::path& path() const { return path_; }
    const nlohmann::json& doc() const { return doc_; }
    // "FILE: field 'NAME' MESSAGE" as a PackageError, for checks the caller does itself.
    [[noreturn]] void fail(const std::string& dotted, const std::string& message) const;

private:
    JsonFile(std::filesystem::path path, nlohmann::json doc) : path_(std::move(path)), doc_(std::move(doc)) {}
    const nlohmann::json* find(const std::string& dotted) const;

    std::filesystem::path path_;
    nlohmann::json doc_;
};

}  // namespace ncnnport
