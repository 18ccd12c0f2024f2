#include "ncnnport/stream_times.h"

#include <atomic>

namespace ncnnport {

namespace {
std::atomic<int64_t>& stream_nanoseconds() {
    static std::atomic<int64_t> ns{0};
    return ns;
}
}  // namespace

double weight_stream_seconds() { return static_cast<double>(stream_nanoseconds().load()) * 1e-9; }

void StreamTimes::add(size_t bytes, double seconds) {
    stream_nanoseconds().fetch_add(static_cast<int64_t>(seconds * 1e9));
    std::lock_guard<std::mutex> lock(mutex_);
    Sum& s = by_bytes_[bytes];
    ++s.calls;
    s.seconds += seconds;
}

nlohmann::json StreamTimes::json() const {
    std::lock_guard<std::mutex> lock(mutex_);
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [bytes, s] : by_bytes_) {
        const double gbps = s.seconds > 0.0 ? static_cast<double>(bytes) * static_cast<double>(s.calls) / s.seconds / 1e9 : 0.0;
        rows.push_back({{"bytes", bytes}, {"calls", s.calls}, {"seconds", s.seconds}, {"gbps", gbps}});
    }
    return rows;
}

StreamTimes& gemv_stream_times(bool fp16) {
    static StreamTimes fp32_times, fp16_times;
    return fp16 ? fp16_times : fp32_times;
}

StreamTimes& int8_gemv_stream_times() {
    static StreamTimes times;
    return times;
}

}  // namespace ncnnport
