#include "ncnnport/gemv_prefetch.h"

#include "ncnnport/stats.h"

#include <algorithm>
#include <cmath>

namespace ncnnport {

int prefetch_pairs_won(const std::vector<double>& on, const std::vector<double>& off) {
    int won = 0;
    for (size_t i = 0; i < std::min(on.size(), off.size()); ++i) won += on[i] > off[i] * (1.0 + kGemvPrefetchMargin);
    return won;
}

GemvPrefetchChoice::Pick GemvPrefetchChoice::pick(size_t weight_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (weight_bytes < min_bytes_) return {state_ == 1, false};
    if (warmup_left_ > 0) {
        --warmup_left_;
        return {false, false};
    }
    // a pair's second call runs the other variant on a call of the same size (undecided: right after
    // the first; decided: the next call of that size)
    if (pending_bytes_ == weight_bytes) {
        pending_bytes_ = 0;
        return {!pending_prefetch_, true};
    }
    if (state_ >= 0) {  // a started pair waits for the next call of its size; every call counts
        ++calls_since_pair_;  // (so the starts step through every position of a repeating call order)
        if (pending_bytes_ != 0 || calls_since_pair_ < recheck_every_) return {state_ == 1, false};
        calls_since_pair_ = 0;
    }
    // a pair's first call (undecided: a call of another size takes the place of an unpaired first
    // call). The pairs come in blocks of two, one of each order; a pseudo-random bit picks the block's
    // first order, so the order never keeps step with a repeating call order.
    const bool block_second = std::min(on_.size(), off_.size()) % 2 == 1;
    if (!block_second) block_prefetch_first_ = (order_bits_() >> 15) & 1u;
    pending_bytes_ = weight_bytes;
    pending_prefetch_ = block_second ? !block_prefetch_first_ : block_prefetch_first_;
    return {pending_prefetch_, true};
}

void GemvPrefetchChoice::record(bool prefetch, size_t weight_bytes, double seconds) {
    if (seconds <= 0.0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const double gbps = static_cast<double>(weight_bytes) / seconds / 1e9;
    if (pending_bytes_ != 0) {  // a pair's first call (an unpaired first call before it is replaced)
        first_gbps_ = gbps;
        first_prefetch_ = prefetch;
        return;
    }
    if (first_gbps_ <= 0.0 || first_prefetch_ == prefetch) return;  // no first call to pair with
    on_.push_back(prefetch ? gbps : first_gbps_);
    off_.push_back(prefetch ? first_gbps_ : gbps);
    first_gbps_ = 0.0;
    decide();
}

double GemvPrefetchChoice::recent_ratio() const {
    const size_t pairs = std::min(on_.size(), off_.size());
    if (pairs == 0) return 0.0;
    const size_t from = pairs > static_cast<size_t>(kGemvPrefetchRecheckPairs) ? pairs - kGemvPrefetchRecheckPairs : 0;
    std::vector<double> ratios;
    for (size_t i = from; i < pairs; ++i) ratios.push_back(on_[i] / off_[i]);
    return median(ratios);
}

int GemvPrefetchChoice::recheck_every() const {
    const double r = recent_ratio();
    if (r <= 0.0) return kGemvPrefetchRecheckEvery;
    const double cost = std::max(r, 1.0 / r) - 1.0;  // of a call, when the variant not chosen runs
    const double every = std::ceil(cost / kGemvPrefetchRecheckCost);
    return static_cast<int>(std::clamp(every, static_cast<double>(kGemvPrefetchRecheckEvery),
                                       static_cast<double>(kGemvPrefetchRecheckMaxEvery)));
}

void GemvPrefetchChoice::decide() {
    const int pairs = static_cast<int>(std::min(on_.size(), off_.size()));
    const int before = state_;
    recheck_every_ = recheck_every();
    if (first_state_ < 0) {
        if (pairs == kGemvPrefetchSamples) {
            const int won = prefetch_pairs_won(on_, off_);
            if (won >= kGemvPrefetchWinsNeeded) state_ = 1;
            else if (won <= kGemvPrefetchNoEffectWins) state_ = 0;  // else: 8 more pairs
        } else if (pairs >= kGemvPrefetchExtendedSamples) {
            state_ = prefetch_pairs_won(on_, off_) >= kGemvPrefetchExtendedWinsNeeded ? 1 : 0;
        }
        if (state_ >= 0) {
            first_state_ = state_;
            first_pairs_ = pairs;
            first_won_ = prefetch_pairs_won(on_, off_);
        }
        return;
    }
    if (pairs < kGemvPrefetchRecheckPairs) return;
    const double ratio = recent_ratio();
    if (ratio >= 1.0 + kGemvPrefetchMargin) state_ = 1;
    else if (ratio <= 1.0) state_ = 0;
    switches_ += state_ != before;
}

bool GemvPrefetchChoice::on() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_ == 1;
}

GemvPrefetchChoice::Report GemvPrefetchChoice::report() const {
    std::lock_guard<std::mutex> lock(mutex_);
    Report r;
    r.state = state_ < 0 ? "undecided" : (state_ == 1 ? "on" : "off");
    r.samples_on = static_cast<int>(on_.size());
    r.samples_off = static_cast<int>(off_.size());
    r.pairs_won = prefetch_pairs_won(on_, off_);
    r.recent_ratio = recent_ratio();
    r.median_on_gbps = median(on_);
    r.median_off_gbps = median(off_);
    r.first_pairs = first_pairs_;
    r.first_won = first_won_;
    r.first_state = first_state_ < 0 ? "" : (first_state_ == 1 ? "on" : "off");
    r.switches = switches_;
    r.recheck_every = recheck_every_;
    return r;
}

nlohmann::json prefetch_report_json(const GemvPrefetchChoice::Report& r) {
    return {{"state", r.state}, {"samples_on", r.samples_on}, {"samples_off", r.samples_off}, {"pairs_won", r.pairs_won},
            {"median_on_gbps", r.median_on_gbps}, {"median_off_gbps", r.median_off_gbps},
            {"first", {{"pairs", r.first_pairs}, {"won", r.first_won}, {"state", r.first_state}}},
            {"recent_ratio", r.recent_ratio}, {"switches", r.switches}, {"recheck_every", r.recheck_every}};
}

PrefetchPlan::PrefetchPlan(GemvPrefetchChoice& whether, GemvPrefetchChoice& how_far, size_t bytes)
    : whether_(whether), how_far_(how_far), bytes_(bytes), pick_(whether.pick(bytes)) {
    far_ = pick_.prefetch && !pick_.sample ? how_far.pick(bytes) : GemvPrefetchChoice::Pick{how_far.on(), false};
}

void PrefetchPlan::record(double seconds) const {
    if (pick_.sample) whether_.record(pick_.prefetch, bytes_, seconds);
    if (far_.sample) how_far_.record(far_.prefetch, bytes_, seconds);
}

GemvPrefetchChoice& gemv_prefetch_choice(bool fp16) {
    static GemvPrefetchChoice fp32_choice, fp16_choice;
    return fp16 ? fp16_choice : fp32_choice;
}

GemvPrefetchChoice& gemv_prefetch_distance_choice(bool fp16) {
    static GemvPrefetchChoice fp32_choice(kGemvPrefetchMinBytes, 0), fp16_choice(kGemvPrefetchMinBytes, 0);
    return fp16 ? fp16_choice : fp32_choice;
}

GemvPrefetchChoice& int8_gemv_prefetch_choice() {
    static GemvPrefetchChoice choice(kPastL2PrefetchMinBytes);
    return choice;
}

GemvPrefetchChoice& int8_gemv_prefetch_distance_choice() {
    static GemvPrefetchChoice choice(kPastL2PrefetchMinBytes, 0);
    return choice;
}

GemvPrefetchChoice& int8_gemv_streams_choice() {
    static GemvPrefetchChoice choice(kPastL2PrefetchMinBytes);
    return choice;
}

GemvPrefetchChoice& gemv_streams_choice(bool fp16) {
    static GemvPrefetchChoice fp32_choice, fp16_choice;
    return fp16 ? fp16_choice : fp32_choice;
}

GemvPrefetchChoice& attention_prefetch_choice(bool scores) {
    static GemvPrefetchChoice scores_choice(kPastL2PrefetchMinBytes), weighted_choice(kPastL2PrefetchMinBytes);
    return scores ? scores_choice : weighted_choice;
}

GemvPrefetchChoice& attention_prefetch_distance_choice(bool scores) {
    static GemvPrefetchChoice scores_choice(kPastL2PrefetchMinBytes, 0), weighted_choice(kPastL2PrefetchMinBytes, 0);
    return scores ? scores_choice : weighted_choice;
}

}  // namespace ncnnport
