#include "ncnnport/model_json.h"

#include <fstream>
#include <sstream>

namespace ncnnport {

JsonFile JsonFile::load(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw PackageError(path.string() + ": missing or unreadable");
    std::stringstream text;
    text << in.rdbuf();
    auto doc = nlohmann::json::parse(text.str(), nullptr, false);
    if (doc.is_discarded()) throw PackageError(path.string() + ": not valid JSON");
    if (!doc.is_object()) throw PackageError(path.string() + ": not a JSON object");
    return JsonFile(path, std::move(doc));
}

const nlohmann::json* JsonFile::find(const std::string& dotted) const {
    const nlohmann::json* node = &doc_;
    size_t start = 0;
    while (start <= dotted.size()) {
        const size_t dot = dotted.find('.', start);
        const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (!node->is_object()) return nullptr;
        const auto it = node->find(key);
        if (it == node->end()) return nullptr;
        node = &*it;
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return node;
}

void JsonFile::fail(const std::string& dotted, const std::string& message) const {
    throw PackageError(path_.string() + ": field '" + dotted + "' " + message);
}

bool JsonFile::has(const std::string& dotted) const { return find(dotted) != nullptr; }

const nlohmann::json& JsonFile::at(const std::string& dotted) const {
    const nlohmann::json* node = find(dotted);
    if (node == nullptr) fail(dotted, "missing");
    return *node;
}

int64_t JsonFile::integer(const std::string& dotted) const {
    const auto& v = at(dotted);
    if (!v.is_number_integer()) fail(dotted, "is not an integer");
    return v.get<int64_t>();
}

double JsonFile::number(const std::string& dotted) const {
    const auto& v = at(dotted);
    if (!v.is_number()) fail(dotted, "is not a number");
    return v.get<double>();
}

std::string JsonFile::string(const std::string& dotted) const {
    const auto& v = at(dotted);
    if (!v.is_string()) fail(dotted, "is not a string");
    return v.get<std::string>();
}

std::vector<int64_t> JsonFile::integers(const std::string& dotted) const {
    const auto& v = at(dotted);
    if (!v.is_array()) fail(dotted, "is not an array of integers");
    std::vector<int64_t> out;
    for (const auto& x : v) {
        if (!x.is_number_integer()) fail(dotted, "is not an array of integers");
        out.push_back(x.get<int64_t>());
    }
    return out;
}

}  // namespace ncnnport
