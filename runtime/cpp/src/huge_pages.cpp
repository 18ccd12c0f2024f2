#include "ncnnport/huge_pages.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 uapi; older libc headers lack the name
#endif
#endif

namespace ncnnport {

namespace {

std::mutex g_mutex;
HugePageStep g_total;  // every call's sums, the first error kept

#if defined(__linux__)
struct Mapping {
    uintptr_t begin = 0, end = 0;
    uint64_t huge_kb = 0;  // bytes / 1024 on huge pages already
    bool candidate = false;  // private, writable, anonymous (no path, not the stack)
};

// /proc/self/smaps: the mappings with their bytes on huge pages.
std::vector<Mapping> read_mappings() {
    std::vector<Mapping> out;
    std::ifstream f("/proc/self/smaps");
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        const char c = line[0];
        const bool header = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        if (header && line.find('-') < line.find(' ')) {
            std::istringstream in(line);
            std::string range, perms, offset, dev, inode, path;
            in >> range >> perms >> offset >> dev >> inode;
            std::getline(in, path);
            path.erase(0, path.find_first_not_of(' '));
            Mapping m;
            const size_t dash = range.find('-');
            m.begin = std::stoull(range.substr(0, dash), nullptr, 16);
            m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
            m.candidate = perms.size() >= 4 && perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p'
                          && (path.empty() || path == "[heap]");
            out.push_back(m);
        } else if (!out.empty() && line.rfind("AnonHugePages:", 0) == 0) {
            out.back().huge_kb = std::stoull(line.substr(14));
        }
    }
    return out;
}

constexpr uintptr_t kHuge = 2u << 20;
constexpr uintptr_t kPage = 4096;

// [start, stop) runs of whole 2 MiB frames in [begin, end) (both frame-aligned) whose every 4 KiB
// page is present: bit 63 of its /proc/self/pagemap entry (readable for one's own pages).
std::vector<std::pair<uintptr_t, uintptr_t>> resident_frame_runs(int pagemap, uintptr_t begin, uintptr_t end) {
    std::vector<std::pair<uintptr_t, uintptr_t>> runs;
    std::vector<uint64_t> entries(kHuge / kPage);
    for (uintptr_t frame = begin; frame < end; frame += kHuge) {
        const ssize_t want = static_cast<ssize_t>(entries.size() * sizeof(uint64_t));
        if (pread(pagemap, entries.data(), want, static_cast<off_t>(frame / kPage * sizeof(uint64_t))) != want) break;
        bool full = true;
        for (uint64_t e : entries) full = full && (e >> 63) != 0;
        if (!full) continue;
        if (!runs.empty() && runs.back().second == frame) runs.back().second = frame + kHuge;
        else runs.emplace_back(frame, frame + kHuge);
    }
    return runs;
}

// MADV_COLLAPSE, tried again on EAGAIN (the kernel's "transient failure": a page it could not
// lock or a huge page it could not allocate at that moment), a few times, 2 MiB frame by frame.
bool collapse(void* p, size_t n) {
    if (madvise(p, n, MADV_COLLAPSE) == 0) return true;
    if (errno != EAGAIN) return false;
    bool all = true;
    for (size_t off = 0; off < n; off += kHuge) {
        bool done = false;
        for (int attempt = 0; attempt < 3 && !done; ++attempt)
            done = madvise(static_cast<char*>(p) + off, kHuge, MADV_COLLAPSE) == 0;
        all = all && done;
    }
    if (!all) errno = EAGAIN;
    return all;
}

uint64_t smaps_rollup_kb(const char* field) {
    std::ifstream f("/proc/self/smaps_rollup");
    std::string line;
    const std::string key = std::string(field) + ":";
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size()));
    return 0;
}
#endif

}  // namespace

HugePageStep back_large_mappings_with_huge_pages(uint64_t min_bytes) {
    HugePageStep step;
#if defined(__linux__)
    const uint64_t before = smaps_rollup_kb("AnonHugePages");
    const int pagemap = open("/proc/self/pagemap", O_RDONLY);
    if (pagemap < 0) step.error = std::string("/proc/self/pagemap: ") + std::strerror(errno);
    for (const Mapping& m : pagemap < 0 ? std::vector<Mapping>() : read_mappings()) {
        // the whole 2 MiB frames inside the mapping; a partial frame at either end stays small
        const uintptr_t begin = (m.begin + kHuge - 1) & ~(kHuge - 1), end = m.end & ~(kHuge - 1);
        if (!m.candidate || end <= begin || end - begin < std::max<uint64_t>(min_bytes, kHuge)) continue;
        if (m.huge_kb * 1024 >= end - begin) continue;  // collapsed by an earlier graph's call
        for (const auto& [start, stop] : resident_frame_runs(pagemap, begin, end)) {
            void* p = reinterpret_cast<void*>(start);
            if (collapse(p, stop - start)) continue;
            if (step.error.empty()) step.error = std::string("MADV_COLLAPSE: ") + std::strerror(errno);
            if (madvise(p, stop - start, MADV_HUGEPAGE) == 0) step.advised_bytes += stop - start;
        }
    }
    if (pagemap >= 0) close(pagemap);
    // frames already huge go to the kernel again (a no-op there): count only the growth
    const uint64_t after = smaps_rollup_kb("AnonHugePages");
    step.collapsed_bytes = after > before ? (after - before) * 1024 : 0;
#else
    (void)min_bytes;
    step.error = "not Linux: no transparent huge pages";
#endif
    std::lock_guard<std::mutex> lock(g_mutex);
    g_total.collapsed_bytes += step.collapsed_bytes;
    g_total.advised_bytes += step.advised_bytes;
    if (g_total.error.empty()) g_total.error = step.error;
    return step;
}

nlohmann::json huge_pages_json(bool enabled) {
    std::lock_guard<std::mutex> lock(g_mutex);
    nlohmann::json out = {{"enabled", enabled}, {"collapsed_bytes", g_total.collapsed_bytes},
                          {"advised_bytes", g_total.advised_bytes},
                          {"error", g_total.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(g_total.error)}};
#if defined(__linux__)
    out["anon_huge_pages_bytes"] = smaps_rollup_kb("AnonHugePages") * 1024;
#endif
    return out;
}

}  // namespace ncnnport
