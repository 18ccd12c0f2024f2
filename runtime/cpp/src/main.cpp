// ncnnport-cpp: the command-line face of ncnnport_rt, used by the tests and by CI.
//
//   ncnnport-cpp check PACKAGE                 verify PACKAGE against its manifest.json
//   ncnnport-cpp tokenize TOKENIZER.json TEXT  print the ids of TEXT, space separated
//   ncnnport-cpp tokenize TOKENIZER.json --jsonl     one JSON string a line on stdin -> one
//                                              JSON id array a line on stdout (batch tests)
//   ncnnport-cpp tokenize TOKENIZER.json --decode [--keep-special]
//                                              ids (whitespace separated) on stdin -> text
//   ncnnport-cpp version                        ncnn version linked in
//   ncnnport-cpp verify PACKAGE [--threads N] [--vulkan] [--ncnn-gemv | --gemv-kernel] [--precision NAME]
//                                              manifest + every graph's golden vectors through
//                                              ncnn::Net, judged as `ncnnport verify` judges
//                                              (--precision: fp32, fp16-storage or bf16, precision.h;
//                                              a reduced one judged by the policy's mode of it)
//   ncnnport-cpp precisions                    the precisions this runtime accepts (flags, mode)
//                                              and the runtime/precision.py names it refuses (JSON)
//   ncnnport-cpp gates POLICY.json MODE MODULE  the module's per-output gates in a precision mode
//                                              (JSON; what verify judges by on --vulkan)
//   ncnnport-cpp fp16-bits IN OUT              raw float32 values of IN as the fp16 bits the K/V
//                                              cache stores (fp16.h; uint16 little-endian to OUT)
//   ncnnport-cpp argmax IN                     the index greedy decoding takes from the raw float32
//                                              values of IN (greedy.h; printed)
//   ncnnport-cpp read-bandwidth [--mib N] [--runs R] [--threads T]
//                                              the read bandwidth of a vector sum over N MiB (256),
//                                              plain and with the kernels' software prefetch,
//                                              median of R (7) alternating runs (read_probe.h; JSON)
//
// Exit codes: 0 ok, 1 check found problems, a golden row failed or input was refused, 2 usage
// or (verify) a package that cannot be judged.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <iostream>
#include <string>
#include <vector>

#include "ncnnport/bpe_tokenizer.h"
#include "ncnnport/concurrent_calls.h"
#include "ncnnport/fp16.h"
#include "ncnnport/greedy.h"
#ifdef NCNNPORT_WITH_NCNN
#include "ncnnport/golden_verify.h"
#endif
#include "ncnnport/manifest.h"
#include "ncnnport/model_json.h"
#include "ncnnport/policy.h"
#include "ncnnport/precision.h"
#ifdef NCNNPORT_WITH_NCNN
#include "ncnnport/read_probe.h"
#endif
#include "ncnnport/sha256.h"

#ifdef NCNNPORT_WITH_NCNN
#include <c_api.h>  // ncnn (the ncnn target exports include/ncnn)
#endif

namespace {

int usage() {
    std::cerr << "usage: ncnnport-cpp check PACKAGE\n"
                 "       ncnnport-cpp tokenize TOKENIZER.json (TEXT | --jsonl | --decode [--keep-special])\n"
                 "       ncnnport-cpp version\n"
                 "       ncnnport-cpp verify PACKAGE [--threads N] [--vulkan] [--ncnn-gemv | --gemv-kernel] [--precision NAME]\n"
                 "       ncnnport-cpp gates POLICY.json MODE MODULE\n"
                 "       ncnnport-cpp splits MAX_THREADS MAX_CALLS\n"
                 "       ncnnport-cpp precisions\n"
                 "       ncnnport-cpp fp16-bits IN OUT\n"
                 "       ncnnport-cpp argmax IN\n"
                 "       ncnnport-cpp read-bandwidth [--mib N] [--runs R] [--threads T]\n";
    return 2;
}

int cmd_check(const std::string& package) {
    const ncnnport::ManifestCheck result = ncnnport::check_package(package);
    for (const auto& p : result.problems) std::cerr << package << ": " << p << "\n";
    if (!result.problems.empty()) return 1;
    std::cout << "ok: " << result.files_checked << " files match " << package << "/manifest.json\n";
    return 0;
}

void print_ids(const std::vector<int>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
}

int encode_jsonl(const ncnnport::BpeTokenizer& tok) {
    std::string line;
    for (size_t lineno = 1; std::getline(std::cin, line); ++lineno) {
        const auto doc = nlohmann::json::parse(line, nullptr, false);
        if (doc.is_discarded() || !doc.is_string()) {
            std::cerr << "stdin line " << lineno << ": not a JSON string\n";
            return 1;
        }
        std::cout << nlohmann::json(tok.encode(doc.get<std::string>())).dump() << "\n";
    }
    return 0;
}

int decode_stdin(const ncnnport::BpeTokenizer& tok, bool keep_special) {
    std::vector<int> ids;
    std::string word;
    while (std::cin >> word) {
        try {
            size_t used = 0;
            const long long v = std::stoll(word, &used);
            if (used != word.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(word);
            ids.push_back(static_cast<int>(v));
        } catch (const std::exception&) {
            std::cerr << "stdin: '" << word << "' is not a token id\n";
            return 1;
        }
    }
    std::cout << tok.decode(ids, !keep_special);
    return 0;
}

int cmd_tokenize(const std::vector<std::string>& args) {
    const auto tok = ncnnport::BpeTokenizer::from_file(args[0]);
    if (args.size() == 2 && args[1] == "--jsonl") return encode_jsonl(tok);
    if (args.size() >= 2 && args[1] == "--decode") {
        if (args.size() > 3 || (args.size() == 3 && args[2] != "--keep-special")) return usage();
        return decode_stdin(tok, args.size() == 3);
    }
    if (args.size() != 2) return usage();
    print_ids(tok.encode(args[1]));
    return 0;
}

int cmd_version() {
#ifdef NCNNPORT_WITH_NCNN
    std::cout << "ncnn " << ncnn_version() << "\n";
    return 0;
#else
    std::cerr << "built without ncnn\n";
    return 1;
#endif
}

#ifdef NCNNPORT_WITH_NCNN
// Parse `PACKAGE [--threads N] [--vulkan] [--ncnn-gemv | --gemv-kernel] [--precision NAME]`; false on a usage
// error (a precision name is checked by run_verify: one line naming the accepted ones, exit 2).
bool parse_verify_args(const std::vector<std::string>& args, std::string& package, ncnnport::VerifyOptions& opts) {
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--vulkan") {
            opts.vulkan = true;
        } else if (args[i] == "--precision" && i + 1 < args.size()) {
            opts.precision = args[++i];
        } else if (ncnnport::parse_gemv_flag(args[i], opts.gemv)) {
        } else if (args[i] == "--threads" && i + 1 < args.size()) {
            size_t used = 0;
            try {
                opts.threads = std::stoi(args[++i], &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != args[i].size() || opts.threads < 1) return false;
        } else if (package.empty() && args[i].rfind("--", 0) != 0) {
            package = args[i];
        } else {
            return false;
        }
    }
    return !package.empty();
}
#endif

// `verify`: the pass/fail table on stdout; exit 1 on a failed row, 2 on a package that cannot
// be judged (one line on stderr naming the file, module or blob).
int cmd_verify(const std::vector<std::string>& args) {
#ifdef NCNNPORT_WITH_NCNN
    std::string package;
    ncnnport::VerifyOptions opts;
    if (!parse_verify_args(args, package, opts)) return usage();
    return ncnnport::run_verify(package, opts, "verify: ");
#else
    (void)args;
    std::cerr << "built without ncnn\n";
    return 2;
#endif
}

// `gates`: Policy.module(MODULE, MODE) of a policy.json as JSON ({"*": gate, output: gate, ...}),
// doubles printed round-trip exact, so a test can hold them against the Python policy's.
int cmd_gates(const std::string& policy_file, const std::string& mode, const std::string& module) {
    try {
        const ncnnport::ModuleGates gates = ncnnport::TolerancePolicy::load(policy_file).module(module, mode);
        auto as_json = [](const ncnnport::Gate& g) {
            return nlohmann::json{{"min_cosine", g.min_cosine}, {"max_abs_rel", g.max_abs_rel},
                                  {"max_abs_floor", g.max_abs_floor}};
        };
        nlohmann::json out{{"*", as_json(gates.star)}};
        for (const auto& [name, g] : gates.outputs) out[name] = as_json(g);
        std::cout << out.dump() << "\n";
        return 0;
    } catch (const ncnnport::PackageError& e) {
        std::cerr << "gates: " << e.what() << "\n";
        return 2;
    }
}

// Every thread split for 1..max_threads threads and 1..max_calls concurrent calls, as JSON rows
// [threads, calls, workers, threads_each]: the rule runtime/concurrent_calls.py states too, so a
// test holds the two against each other over the whole table.
int cmd_splits(const std::string& max_threads, const std::string& max_calls) {
    int t_max = 0, k_max = 0;
    try {
        t_max = std::stoi(max_threads);
        k_max = std::stoi(max_calls);
    } catch (const std::exception&) {
        return usage();
    }
    if (t_max < 1 || k_max < 1 || t_max > 4096 || k_max > 4096) return usage();
    nlohmann::json rows = nlohmann::json::array();
    for (int t = 1; t <= t_max; ++t)
        for (int k = 1; k <= k_max; ++k) {
            const ncnnport::CallSplit s = ncnnport::split_threads(t, k);
            rows.push_back({t, k, s.workers, s.threads_each});
        }
    std::cout << rows.dump() << "\n";
    return 0;
}

// The float32 values of file `in` as fp16 bits (fp16.h) in file `out`: the K/V cache's rounding,
// exposed so a test can hold it against numpy's astype(float16) bit for bit.
// The raw float32 values of file `in` (the tools' test input); a partial value is an error.
std::vector<float> read_float32_file(const std::string& in) {
    std::ifstream f(in, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) throw std::runtime_error("cannot read " + in);
    if (bytes.size() % sizeof(float)) throw std::runtime_error(in + ": not a whole number of float32 values");
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
}

int cmd_fp16_bits(const std::string& in, const std::string& out) {
    const std::vector<float> values = read_float32_file(in);
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = ncnnport::fp16_bits(values[i]);
    std::ofstream o(out, std::ios::binary);
    o.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(bits.size() * sizeof(uint16_t)));
    if (!o) throw std::runtime_error("cannot write " + out);
    return 0;
}

// `argmax`: greedy.h's choice over a raw float32 file (the tests hold it to numpy.argmax).
int cmd_argmax(const std::string& in) {
    std::cout << ncnnport::greedy(read_float32_file(in)) << "\n";
    return 0;
}

}  // namespace

// `read-bandwidth`: read_probe.h's measurement as one JSON object on stdout.
int cmd_read_bandwidth(const std::vector<std::string>& args) {
#ifdef NCNNPORT_WITH_NCNN
    int mib = 256, runs = 7, threads = 1;
    for (size_t i = 1; i < args.size(); ++i) {
        int* target = args[i] == "--mib" ? &mib : args[i] == "--runs" ? &runs : args[i] == "--threads" ? &threads : nullptr;
        if (!target || i + 1 >= args.size()) return usage();
        size_t used = 0;
        try {
            *target = std::stoi(args[++i], &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != args[i].size() || *target < 1 || *target > (target == &mib ? 65536 : 4096)) return usage();
    }
    const ncnnport::ReadProbe probe = ncnnport::measure_read_bandwidth(static_cast<size_t>(mib) << 20, runs, threads);
    std::cout << nlohmann::json{{"plain_gbps", probe.plain_gbps}, {"prefetch_gbps", probe.prefetch_gbps},
                                {"prefetch_near_gbps", probe.prefetch_near_gbps},
                                {"streams4_gbps", probe.streams4_gbps},
                                {"isa", probe.isa}, {"mib", mib}, {"runs", runs}, {"threads", threads}}.dump() << "\n";
    return 0;
#else
    (void)args;
    std::cerr << "built without ncnn\n";
    return 2;
#endif
}

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    try {
        if (args.size() == 2 && args[0] == "check") return cmd_check(args[1]);
        if (args.size() >= 2 && args[0] == "tokenize")
            return cmd_tokenize(std::vector<std::string>(args.begin() + 1, args.end()));
        if (args.size() == 1 && args[0] == "version") return cmd_version();
        if (args.size() == 4 && args[0] == "gates") return cmd_gates(args[1], args[2], args[3]);
        if (args.size() == 3 && args[0] == "splits") return cmd_splits(args[1], args[2]);
        if (args.size() == 3 && args[0] == "fp16-bits") return cmd_fp16_bits(args[1], args[2]);
        if (args.size() == 2 && args[0] == "argmax") return cmd_argmax(args[1]);
        if (!args.empty() && args[0] == "read-bandwidth") return cmd_read_bandwidth(args);
        if (args.size() == 1 && args[0] == "precisions") {
            std::cout << ncnnport::precisions_table_json().dump() << "\n";
            return 0;
        }
        if (args.size() >= 2 && args[0] == "verify")
            return cmd_verify(std::vector<std::string>(args.begin() + 1, args.end()));
        return usage();
    } catch (const ncnnport::TokenizerError& e) {
        std::cerr << e.what() << "\n";
    } catch (const ncnnport::IoError& e) {
        std::cerr << e.what() << "\n";
    } catch (const std::exception& e) {
        std::cerr << "ncnnport-cpp: " << e.what() << "\n";
    }
    return 1;
}
