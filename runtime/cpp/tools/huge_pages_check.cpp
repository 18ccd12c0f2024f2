// ncnnport-huge-pages-check: back_large_mappings_with_huge_pages (huge_pages.h) on a buffer
// allocated the way ncnn allocates weights (ncnn::fastMalloc), filled, then collapsed.
//
//   ncnnport-huge-pages-check [--mib N]
//
// Why: the executables' JSON reports what the step did on their own weights, but a test needs a
// case whose answer is known: N MiB (default 64) of resident anonymous memory must end on huge
// pages, or the step must say why not. Prints one JSON object: the THP setting, the buffer's
// bytes, the step's collapsed / advised bytes and error, and the process's AnonHugePages before
// and after. Exit 0 after printing (the test judges), 2 on bad arguments.
#include <allocator.h>  // ncnn::fastMalloc

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "ncnnport/huge_pages.h"

int main(int argc, char** argv) {
    size_t mib = 64;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        if (f == "--mib" && i + 1 < argc) mib = std::stoul(argv[++i]);
        else {
            std::cerr << "ncnnport-huge-pages-check: usage: [--mib N]\n";
            return 2;
        }
    }
    const size_t bytes = mib << 20;
    auto* p = static_cast<unsigned char*>(ncnn::fastMalloc(bytes));
    if (!p) {
        std::cerr << "ncnnport-huge-pages-check: could not allocate " << bytes << " bytes\n";
        return 2;
    }
    std::memset(p, 1, bytes);  // resident, as loaded weights are
    std::string thp;
    std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
    const auto before = ncnnport::huge_pages_json(true)["anon_huge_pages_bytes"];
    const ncnnport::HugePageStep step = ncnnport::back_large_mappings_with_huge_pages();
    const auto after = ncnnport::huge_pages_json(true)["anon_huge_pages_bytes"];
    nlohmann::json out = {{"thp_enabled", thp}, {"buffer_bytes", bytes}, {"collapsed_bytes", step.collapsed_bytes},
                          {"advised_bytes", step.advised_bytes}, {"error", step.error},
                          {"anon_huge_pages_before", before}, {"anon_huge_pages_after", after},
                          {"checksum", static_cast<int>(p[bytes / 2])}};
    ncnn::fastFree(p);
    std::cout << out.dump() << "\n";
    return 0;
}
