#include "ncnnport/gemv_prefetch.h"

#include "ncnnport/stats.h"

#include <algorithm>

namespace ncnnport {

int prefetch_pairs_won(const std::vector<double>& on, const std::vector<double>& off) {
    int won = 0;
    for (size_t i = 0; i < std::min(on.size(), off.size()); ++i) won += on[i] > off[i] * (1.0 + kGemvPrefetchMargin);
    return won;
}

GemvPrefetchChoice::Pick GemvPrefetchChoice::pick(size_t weight_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ >= 0) return {state_ == 1, false};
    if (weight_bytes < min_bytes_) return {false, false};
    // plain first; a prefetching call only right after a plain one of the same size, its pair
    if (pending_bytes_ == weight_bytes) {
        pending_bytes_ = 0;
        return {true, true};
    }
    pending_bytes_ = weight_bytes;
    return {false, true};
}

void GemvPrefetchChoice::record(bool prefetch, size_t weight_bytes, double seconds) {
    if (seconds <= 0.0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ >= 0) return;
    const double gbps = static_cast<double>(weight_bytes) / seconds / 1e9;
    if (prefetch) on_.push_back(gbps);
    else if (off_.size() > on_.size()) off_.back() = gbps;  // the plain call before found no pair: replaced
    else off_.push_back(gbps);
    const int pairs = static_cast<int>(std::min(on_.size(), off_.size()));
    if (pairs == kGemvPrefetchSamples) {
        const int won = prefetch_pairs_won(on_, off_);
        if (won >= kGemvPrefetchWinsNeeded) state_ = 1;
        else if (won <= kGemvPrefetchNoEffectWins) state_ = 0;  // else: 8 more pairs
    } else if (pairs >= kGemvPrefetchExtendedSamples) {
        state_ = prefetch_pairs_won(on_, off_) >= kGemvPrefetchExtendedWinsNeeded ? 1 : 0;
    }
}

GemvPrefetchChoice::Report GemvPrefetchChoice::report() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Report r;
    r.state = state_ < 0 ? "undecided" : (state_ == 1 ? "on" : "off");
    r.samples_on = static_cast<int>(on_.size());
    r.samples_off = static_cast<int>(off_.size());
    r.pairs_won = prefetch_pairs_won(on_, off_);
    r.median_on_gbps = median(on_);
    r.median_off_gbps = median(off_);
    return r;
}

GemvPrefetchChoice& gemv_prefetch_choice(bool fp16) {
    static GemvPrefetchChoice fp32_choice, fp16_choice;
    return fp16 ? fp16_choice : fp32_choice;
}

GemvPrefetchChoice& int8_gemv_prefetch_choice() {
    static GemvPrefetchChoice choice(kPastL2PrefetchMinBytes);
    return choice;
}

GemvPrefetchChoice& attention_prefetch_choice(bool scores) {
    static GemvPrefetchChoice scores_choice(kPastL2PrefetchMinBytes), weighted_choice(kPastL2PrefetchMinBytes);
    return scores ? scores_choice : weighted_choice;
}

}  // namespace ncnnport
