// ncnnport-prefetch-choice-check: drives one GemvPrefetchChoice (gemv_prefetch.h) with a scripted
// sequence of calls, so the tests can hold its pairing rule without timing a real kernel.
//
//   ncnnport-prefetch-choice-check --min-bytes B < calls
//
// Each line of standard input is one call: "BYTES PLAIN_GBPS PREFETCH_GBPS", the read speed the
// call would have in either variant. The tool asks pick(BYTES), and records a sampled call with the
// seconds its picked variant's speed gives. Why: a choice that pairs calls of different sizes can
// read a size difference as a prefetch difference; a script makes that case exact.
// Prints one JSON object: "calls" ([{bytes, prefetch, sample}] in order) and "report" (state,
// samples, pairs won, medians). Exit 0 after printing, 2 on bad input.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>
#include <string>

#include "ncnnport/gemv_prefetch.h"

int main(int argc, char** argv) {
    if (argc != 3 || std::string(argv[1]) != "--min-bytes") {
        std::cerr << "usage: ncnnport-prefetch-choice-check --min-bytes B < calls\n";
        return 2;
    }
    ncnnport::GemvPrefetchChoice choice(std::stoull(argv[2]));
    nlohmann::json calls = nlohmann::json::array();
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        std::istringstream in(line);
        size_t bytes = 0;
        double plain = 0.0, prefetching = 0.0;
        if (!(in >> bytes >> plain >> prefetching) || plain <= 0.0 || prefetching <= 0.0) {
            std::cerr << "ncnnport-prefetch-choice-check: bad line: " << line << "\n";
            return 2;
        }
        const auto pick = choice.pick(bytes);
        if (pick.sample) choice.record(pick.prefetch, bytes, static_cast<double>(bytes) / ((pick.prefetch ? prefetching : plain) * 1e9));
        calls.push_back({{"bytes", bytes}, {"prefetch", pick.prefetch}, {"sample", pick.sample}});
    }
    std::cout << nlohmann::json{{"calls", calls}, {"report", ncnnport::prefetch_report_json(choice.report())}}.dump()
              << "\n";
    return 0;
}
