// Whether the one-row InnerProduct kernel (gemv_layer.h) prefetches its weight stream in software,
// chosen on the machine that runs it, from the model's own calls.
//
// Why measured, not fixed: prefetching kGemvPrefetchBytes ahead of the fp16 weight stream read
// qwen3-asr real-L4's fp16 token in 36.3-37.3 ms against 49.7-51.4 on the device's Intel Xeon
// (1 thread), and made the same token slower on an AMD EPYC (17.7-19.4 against 15.2-15.4 ms); the
// Xeon's fp32 stream gained nothing. A rule by CPU name would be fitted to two machines. Prefetch
// instructions change no arithmetic, so the two variants give the same bits and the choice can be
// made on real calls: one-row calls of layers with at least kGemvPrefetchMinBytes of weights
// (a decode step's head shards and projections) alternate plain and prefetching until
// kGemvPrefetchSamples pairs are timed: two calls in a row that read the same bytes, one in each
// variant (a first call followed by a call of another size is re-taken: calls of different sizes
// differ in GB/s by more than the prefetch, a start-up being a larger share of a small call), the
// pairs in blocks of two, one plain first and one prefetching first, the block's first order a
// pseudo-random bit (kGemvPrefetchOrderSeed: a strict alternation can keep step with a call order
// that repeats every two calls, and then one order always meets the faster call). Why both orders:
// with plain always first (the rule before 2026-12-05), whatever favours the later call of a pair
// counted as prefetch's gain: a machine reading faster as a run warms up, or a projection that
// follows the pair's first one in memory (gate then up). With both orders in every block such an
// advantage helps prefetch in half the pairs and plain in the other half, so the sign test's
// guarantee below holds against it too (tests/cpp/test_gemv_layer.py scripts both cases); a real
// gain smaller than it (plus the margin) is then left to the rechecks below, whose median ratio
// falls between the two orders' ratios. In the model no difference showed outside the noise: on the
// AVX2-only EPYC (qwen3-asr real-L4 fp16, 32 tokens, 2026-12-05, 12 pairs of runs, the build that
// ran first alternating) the tokens took a median 1.03x the old rule's time [0.94, 1.10], the same
// text, and the first decision came out "on" in 6 of 12 runs under either rule (its first tokens
// read faster prefetching there; it was off again at the end of 22 of the 24 runs). On its int8
// package (package-int8w, the same A/B) 0.93x [0.89, 1.06], the same text; there the old rule's
// first decisions read 0-3 wins of 8 and this one's 3-4 in 9 of 12 runs (6 and 7 of 8, 12 of 16
// in the others; every run ended off), which suggests the later call of a pair read slower there.
// Prefetch is
// kept when it read faster by more than kGemvPrefetchMargin in at least kGemvPrefetchWinsNeeded
// of the pairs: a sign test, so one slow call on a loaded machine cannot switch it on (with no
// real difference, 7 or more wins of 8 come with probability at most 9/256). The test is
// sequential: 5 or 6 wins of 8 (neither no effect, at most 4, nor a clear one) take 8 more pairs
// and keep prefetch at 13 or more wins of the 16. Why: transient stalls on a shared machine turned
// a real gain into 6 wins of 8 (the 2-core Xeon's fp16 stream, on in most runs, then 39.8-45.0
// against 31.4-34.2 ms per token); the extension keeps the guard (with no real difference prefetch
// is kept with probability at most 10.2/256: 9/256 at 8 pairs, 1.2/256 more through the
// extension). One choice per weight width (fp32, fp16), per process, and one per decode-attention
// product (the K/V cache stream, below).
//
// The first kGemvPrefetchWarmupCalls calls of the sampled sizes run plain and are not sampled (on
// Qwen3-ASR about the first two decode steps: 21 such fp16 calls per step), and the choice keeps
// checking after it is made: every kGemvPrefetchRecheckEvery-th call of the sampled sizes starts
// one more pair (completed by the next call of its size), and from kGemvPrefetchRecheckPairs pairs
// on, after each pair, the median of the last kGemvPrefetchRecheckPairs pairs' speed ratios
// (prefetching / plain) sets the state: on at 1 + kGemvPrefetchMargin or more, off at 1 or less,
// unchanged in between.
// Why: the first pairs come from a run's first tokens, and on this project's 2-core Xeon (a VM,
// 2026-12-04) weights read slowly for the first ~1 s of reading them, prefetch gaining little
// there: qwen3-asr real-L4 fp16, forced one way per process, 128 tokens, per call GB/s: tokens 0-3
// plain 14.3-15.6 vs prefetching 14.9-15.8, tokens 40-120 plain 15.2-16.2 vs 17.1-18.3. The
// one-shot rule chose "off" in 4 of 4 runs (2-11 wins) that read 27.5-28.0 ms per token where
// forced prefetch read 25.5. A plain sum over fresh huge pages warms the same way (16.0 -> 18.0
// GB/s over its first 20 passes of 432 MB, not shortened by a 3 s sleep or 1.5 s of arithmetic
// first: reading does it, not time), and within one half hour the host went from prefetch gaining
// 8-11 % to gaining nothing and back: the state a run starts in need not last. Why a median of
// ratios and not the first decision's sign test: single calls there vary by +-10 % (a 6 MiB call
// read 10.4-17.3 GB/s within one token), so a real 8-10 % gain won only 2-7 of 8 pairs by the 3 %
// margin, and a sign test over the last 8 pairs switched 7-9 times in a 128-token run.
// The cost of checking: at most one call in kGemvPrefetchRecheckEvery runs the variant not chosen.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <nlohmann/json.hpp>

#include <cstddef>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace ncnnport {

// The prefetching variant asks for each cache line twice: into L2 kGemvPrefetchBytes ahead, then
// from there into L1 kGemvPrefetchNearBytes ahead. Why two levels: a prefetch into L1 holds one of
// the core's few line-fill buffers until its line arrives from DRAM, which caps the lines in
// flight; a prefetch into L2 does not, so far more lines can be on their way. On this project's
// 2-core Xeon (one thread, fp16 weights of Qwen3-ASR's 311 MB head, 9 rounds, runtime/cpp/README.md
// "One-row InnerProduct") L1 only at 4 KB read 14.3 GB/s, L2 only at 8 KB 15.3, both 15.8, an
// AVX-512 sum over the same buffer 16.3.
constexpr size_t kGemvPrefetchBytes = 8192;           // distance ahead into L2
constexpr size_t kGemvPrefetchNearBytes = 1024;       // distance ahead into L1
constexpr size_t kGemvPrefetchMinBytes = 4u << 20;    // layers that stream from DRAM (> any L2)
constexpr int kGemvPrefetchSamples = 8;               // pairs of calls before choosing
constexpr int kGemvPrefetchWinsNeeded = 7;            // pairs prefetch must win
constexpr int kGemvPrefetchNoEffectWins = 4;          // at most this many of 8: off without more pairs
constexpr int kGemvPrefetchExtendedSamples = 16;      // pairs after an undecided first 8
constexpr int kGemvPrefetchExtendedWinsNeeded = 13;   // wins of the 16 that keep prefetch
constexpr int kGemvPrefetchWarmupCalls = 48;          // sampled-size calls run plain before the first pair
constexpr int kGemvPrefetchRecheckEvery = 16;         // sampled-size calls per pair once decided, at least
constexpr int kGemvPrefetchRecheckMaxEvery = 256;     // ... and at most
// What the rechecks may cost: the variant not chosen runs one call in every recheck interval, so
// the interval grows with the measured gap between the two (recheck_every): a call of it costs
// (max(r, 1/r) - 1) of a call, r the recent median speed ratio, and one in
// (max(r, 1/r) - 1) / kGemvPrefetchRecheckCost calls keeps that cost at 1 % of the stream's time.
// Why: at a fixed 1 in 16 the rechecks cost 1/16 of the gap, 0.7 % where prefetch gains 11 % (this
// VM's fp16 stream) but 5 % where plain reads are 1.84x slower (a device lease, 2026-12-04: the fp16
// kernel read 5.5 GB/s plain, 10.1 prefetching). A gap that wide is not near a switch; where the
// ratio nears the bounds (1 and 1 + kGemvPrefetchMargin) the interval is back at 16. The price: a
// gap that vanishes at once is seen later, after 8 pairs at the wide interval (at 1.6x, 8 x 60 =
// 480 calls, about 23 Qwen3-ASR fp16 decode steps) instead of 8 x 16.
constexpr double kGemvPrefetchRecheckCost = 0.01;
constexpr int kGemvPrefetchRecheckPairs = 16;         // pairs whose median ratio rechecks the state
// A win is a prefetching call this much faster than its pair's plain one: not prefetching is the
// safe default (what the hardware prefetchers are built for), so a tie must count as a loss.
constexpr double kGemvPrefetchMargin = 0.03;
// Seeds the pseudo-random bits that order each block of two pairs (std::minstd_rand: the same
// sequence with every standard library, so a run's pairs are reproducible).
constexpr unsigned kGemvPrefetchOrderSeed = 20261205u;

// How far ahead a prefetching stream asks for its lines: into L2 (`far`), then into L1 (`near`).
struct PrefetchDistance {
    size_t far = kGemvPrefetchBytes;
    size_t near = kGemvPrefetchNearBytes;
};
// The kernels' distances, and half of them. Why two: the best distance is the machine's. A
// standalone copy of the fp16 gemv stream (311 MB, 1 thread, medians of 15) read 19.0 GB/s at the
// half distances and 17.8 at the full ones on this project's 2-core Xeon VM (plain 17.1); on the
// device's Xeon the full ones won (14.2-14.8 against 13.4-14.6; 4 threads 67.7 against 62.3). So
// the one-row InnerProduct kernel chooses between them on the machine too
// (gemv_prefetch_distance_choice, from the near one), and so do the int8 one-row kernel
// (int8_gemv_prefetch_distance_choice) and the attention products (attention_prefetch_distance_choice).
constexpr PrefetchDistance kFarPrefetch{kGemvPrefetchBytes, kGemvPrefetchNearBytes};
constexpr PrefetchDistance kNearPrefetch{kGemvPrefetchBytes / 2, kGemvPrefetchNearBytes / 2};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
// The prefetching variant's requests for the `bytes` (a multiple of 64: whole cache lines) that a
// stream reads from `at`: far ahead into L2, near ahead into L1. A prefetch never faults, so the
// addresses past the end of a buffer are harmless.
// `far` / `near` default to the kernels' distances; the read probe also tries half of them.
inline void prefetch_stream_step(const void* at, size_t bytes, size_t far = kGemvPrefetchBytes,
                                 size_t near = kGemvPrefetchNearBytes) {
    const char* p = static_cast<const char*>(at);
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch(p + far + line, _MM_HINT_T1);
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch(p + near + line, _MM_HINT_T0);
}
#endif

// Streams read from DRAM once a step's weights have gone through the caches that are smaller than
// the gemv kernel's layers: the decode attention's products (matmul_layer.h: a step's scores
// against the past K, its weighted sum of the past V) and the int8 projections. Past this size a
// call reads more than an L2 holds, so their choices sample from here.
constexpr size_t kPastL2PrefetchMinBytes = 1u << 20;

// The choice for one stream: a weight width of the gemv kernel, or one attention product.
class GemvPrefetchChoice {
public:
    // Calls reading fewer than `min_bytes` run plain and are not sampled; the first `warmup_calls`
    // of the sampled sizes run plain unsampled (a PrefetchPlan's distance choice takes 0: its calls
    // come after the first choice's warm-up and pairs, on a read path already warm).
    explicit GemvPrefetchChoice(size_t min_bytes = kGemvPrefetchMinBytes, int warmup_calls = kGemvPrefetchWarmupCalls)
        : min_bytes_(min_bytes), warmup_left_(warmup_calls) {}

    struct Pick {
        bool prefetch = false;  // the variant the call runs
        bool sample = false;    // time it and record() it
    };
    struct Report {
        std::string state;  // "undecided", "on" or "off"
        int samples_on = 0, samples_off = 0;
        int pairs_won = 0;          // of every pair
        double recent_ratio = 0.0;  // median prefetching / plain speed of the last kGemvPrefetchRecheckPairs pairs
        double median_on_gbps = 0.0, median_off_gbps = 0.0;  // over every sample
        // the first decision: after how many pairs, their wins, and its state ("" while undecided)
        int first_pairs = 0, first_won = 0;
        std::string first_state;
        int switches = 0;  // state changes since the first decision
        int recheck_every = kGemvPrefetchRecheckEvery;  // sampled-size calls per recheck pair now
    };

    // The variant of the next call that reads `weight_bytes`.
    Pick pick(size_t weight_bytes);
    // A sampled call's read speed; decides once both variants have their samples.
    void record(bool prefetch, size_t weight_bytes, double seconds);
    // Whether the state is "on" now (undecided: no).
    bool on() const;
    Report report() const;

private:
    // The state the pairs give: the first decision's sequential test while undecided, then the
    // recheck's median ratio with the state kept between its bounds.
    void decide();
    double recent_ratio() const;
    // The recheck interval the recent ratio gives (kGemvPrefetchRecheckCost).
    int recheck_every() const;

    const size_t min_bytes_;
    mutable std::mutex mutex_;
    int state_ = -1;  // -1 undecided, 0 off, 1 on
    size_t pending_bytes_ = 0;      // the size of a pair's first call still waiting for its second, else 0
                                    // (undecided: the very next call; decided: the next call of its size)
    bool pending_prefetch_ = false; // the variant that first call ran (the second runs the other)
    bool block_prefetch_first_ = false;  // the order of the current block's first pair (drawn at its start)
    std::minstd_rand order_bits_{kGemvPrefetchOrderSeed};  // fixed: the same orders in every run
    double first_gbps_ = 0.0;       // the first call's GB/s once recorded, until its pair completes
    bool first_prefetch_ = false;
    std::vector<double> on_, off_;  // GB/s of the completed pairs (pair i = off_[i], on_[i])
    int warmup_left_;               // sampled-size calls still to run unsampled
    int calls_since_pair_ = 0;      // sampled-size calls since the last pair started (once decided)
    int recheck_every_ = kGemvPrefetchRecheckEvery;  // recheck_every() after the last pair
    int first_pairs_ = 0, first_won_ = 0, first_state_ = -1, switches_ = 0;
};

// A call's two choices together: whether it prefetches (`whether`) and, if so, how far (`how_far`,
// whose "prefetch" is the far distance and default the near one). A prefetching call the first
// choice does not sample samples the distance; a sampled one runs the distance chosen so far, so
// the first choice compares plain reads with the distance in use. One rule for every kernel that
// prefetches (the one-row fp32/fp16 and int8 kernels, the attention products).
class PrefetchPlan {
public:
    PrefetchPlan(GemvPrefetchChoice& whether, GemvPrefetchChoice& how_far, size_t bytes);
    bool prefetch() const { return pick_.prefetch; }
    // The weight bytes the call streams (what its GB/s are of).
    size_t bytes() const { return bytes_; }
    // The distance a prefetching call asks for.
    PrefetchDistance distance() const { return far_.prefetch ? kFarPrefetch : kNearPrefetch; }
    bool far() const { return far_.prefetch; }
    // Whether either choice samples this call.
    bool sampled() const { return pick_.sample || far_.sample; }
    // A streams choice's pick for this call (int8_gemv_streams_choice, gemv_streams_choice: "prefetch"
    // stands for the streams side by side): `forced` (1 one stream, more side by side) where a check
    // tool forced it, else the choice's current state unsampled where this plan samples the call,
    // else the choice's own pick (so it samples only calls neither prefetch choice does).
    GemvPrefetchChoice::Pick streams_pick(GemvPrefetchChoice& streams, int forced) const {
        if (forced != 0) return {forced > 1, false};
        return sampled() ? GemvPrefetchChoice::Pick{streams.on(), false} : streams.pick(bytes_);
    }
    // The call's time, recorded by whichever choices sampled it.
    void record(double seconds) const;

private:
    GemvPrefetchChoice& whether_;
    GemvPrefetchChoice& how_far_;
    size_t bytes_;
    GemvPrefetchChoice::Pick pick_, far_;
};

// The pairs (on[i], off[i]) in which prefetch read faster by more than kGemvPrefetchMargin.
int prefetch_pairs_won(const std::vector<double>& on, const std::vector<double>& off);

// A report as a run's JSON records it (timing.gemv_prefetch, timing.attention_prefetch).
nlohmann::json prefetch_report_json(const GemvPrefetchChoice::Report& r);

// The process's choice for fp16 (true) or fp32 weights.
GemvPrefetchChoice& gemv_prefetch_choice(bool fp16);
// Among the one-row InnerProduct kernel's prefetching calls of fp16 (true) or fp32 weights, the same
// rule choosing between the distances: "plain" stands for kNearPrefetch, the default, and "prefetch"
// for kFarPrefetch. It samples only calls that prefetch and that the first choice does not sample,
// so it starts once prefetch is on, with no warm-up of its own (the first choice's warm-up and pairs
// came before it: a second warm-up of 48 calls ran the untried distance on a read path already
// warm, on a device lease 1.28x slower than the far one); the first choice's prefetching calls
// run the distance chosen so far. Why the near one first: it beat plain reads on every machine
// measured (this VM 19.0 vs 17.1 GB/s, the device's Xeon 13.4-14.6 vs 8.7-10.4), while the far one
// gained little here in some hours (a 416 MiB sweep: plain 16.6, far 17.1, near 19.2 GB/s), under
// the first choice's 3 % margin: with the far one first, prefetch stayed off and the near distance
// was never tried (fp16 rounds ended "off" at 27.4 ms per token).
GemvPrefetchChoice& gemv_prefetch_distance_choice(bool fp16);
// The int8 one-row kernel's choice (int8_gemv_layer.h). Its projections are 1-3 MB on Qwen3-ASR
// (int8 weights a quarter of fp32's), past any L2 but under kGemvPrefetchMinBytes, so it samples
// from kPastL2PrefetchMinBytes (1 MiB) on.
GemvPrefetchChoice& int8_gemv_prefetch_choice();
// Its distance choice, as gemv_prefetch_distance_choice: "plain" the near distance (the default),
// "prefetch" the far one.
GemvPrefetchChoice& int8_gemv_prefetch_distance_choice();
// Whether the int8 one-row kernel's AVX2 copy reads kAvx2Streams row groups side by side ("prefetch")
// or one at a time ("plain"), by the same rule, on calls the kernel's PrefetchPlan does not sample
// (so it starts once that plan's choices have their pairs; its warm-up runs beside theirs). Why a
// choice: on an AVX2-only EPYC four streams read faster than one (a 160 MB sum 20-22 against 13-15
// GB/s), on an AVX-512 EPYC one stream was the fastest (int8_gemv_layer.cpp).
GemvPrefetchChoice& int8_gemv_streams_choice();
// The same choice for the one-row fp32 (false) / fp16 (true) kernel's narrow layout (gemv_layer.cpp:
// 16-output blocks, packed where the CPU lacks AVX-512F): 4 blocks side by side or one at a time.
GemvPrefetchChoice& gemv_streams_choice(bool fp16);
// The process's choice for the attention scores (true: q K^T) or weighted sums (false: w V),
// each chosen on its own calls (the two kernels read the cache in different patterns).
GemvPrefetchChoice& attention_prefetch_choice(bool scores);
// Each one's distance choice, as gemv_prefetch_distance_choice: "plain" the near distance (the
// default), "prefetch" the far one.
GemvPrefetchChoice& attention_prefetch_distance_choice(bool scores);

}  // namespace ncnnport
