// ncnnport-prefetch-choice-check: drives one GemvPrefetchChoice (gemv_prefetch.h) with a scripted
// sequence of calls, so the tests can hold its pairing rule without timing a real kernel.
//
//   ncnnport-prefetch-choice-check --min-bytes B [--plan] < calls
//
// With --plan each line is "BYTES PLAIN_GBPS NEAR_GBPS FAR_GBPS" and the calls go through a
// PrefetchPlan (whether to prefetch, then how far: the near distance first), as the kernels' calls
// do; each call then also says "far", and "distance_report" is the distance choice's report.
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
    const bool plan_mode = argc == 4 && std::string(argv[3]) == "--plan";
    if ((argc != 3 && !plan_mode) || std::string(argv[1]) != "--min-bytes") {
        std::cerr << "usage: ncnnport-prefetch-choice-check --min-bytes B [--plan] < calls\n";
        return 2;
    }
    ncnnport::GemvPrefetchChoice choice(std::stoull(argv[2])), distance(std::stoull(argv[2]), 0);  // as the kernels' pairs
    nlohmann::json calls = nlohmann::json::array();
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        std::istringstream in(line);
        size_t bytes = 0;
        double plain = 0.0, prefetching = 0.0, far = 0.0;
        if (!(in >> bytes >> plain >> prefetching) || plain <= 0.0 || prefetching <= 0.0 ||
            (plan_mode && (!(in >> far) || far <= 0.0))) {
            std::cerr << "ncnnport-prefetch-choice-check: bad line: " << line << "\n";
            return 2;
        }
        if (plan_mode) {
            const ncnnport::PrefetchPlan plan(choice, distance, bytes);
            const double gbps = !plan.prefetch() ? plain : plan.far() ? far : prefetching;
            plan.record(static_cast<double>(bytes) / (gbps * 1e9));
            calls.push_back({{"bytes", bytes}, {"prefetch", plan.prefetch()}, {"far", plan.far()}});
            continue;
        }
        const auto pick = choice.pick(bytes);
        if (pick.sample) choice.record(pick.prefetch, bytes, static_cast<double>(bytes) / ((pick.prefetch ? prefetching : plain) * 1e9));
        calls.push_back({{"bytes", bytes}, {"prefetch", pick.prefetch}, {"sample", pick.sample}});
    }
    nlohmann::json out{{"calls", calls}, {"report", ncnnport::prefetch_report_json(choice.report())}};
    if (plan_mode) out["distance_report"] = ncnnport::prefetch_report_json(distance.report());
    std::cout << out.dump() << "\n";
    return 0;
}
