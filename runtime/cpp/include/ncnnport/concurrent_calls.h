// Independent calls of one graph side by side, and how the thread budget is split among them
// (runtime/concurrent_calls.py is the same rule). A Youtu-VL window segment is called once per
// window (144-256 rows); one such call leaves most of 16 threads idle, so the windows run
// concurrently, each on its share of the threads, on one ncnn::Net (extractors of one net may
// run on different threads).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ncnnport {

struct CallSplit {
    int workers = 1;       // calls at a time
    int threads_each = 1;  // threads of each call (the count its net is loaded with)
    bool operator==(const CallSplit& o) const { return workers == o.workers && threads_each == o.threads_each; }
};

// ceil(threads / concurrent_calls) threads per call and as many calls at once as that leaves
// room for. Fixed when the graph opens: ncnn's x86 Gemm packs its constant weights in tiles for
// the load-time thread count and runs every later call on that many threads whatever the
// extractor's option says. Throws std::invalid_argument for threads or concurrent_calls < 1.
CallSplit split_threads(int threads, int concurrent_calls);

// Threads that run batches of independent tasks, kept from one batch to the next: every thread
// that calls ncnn gets its own OpenMP team, and new threads per batch would start new teams at
// every layer call (runtime/session.py measured it: the device's 16 threads, Youtu-VL's int8 448
// window layer, new workers per batch 27-31 ms, slower than one window at a time; kept, 21 ms
// against 33-35 one window at a time in the same rounds).
class CallWorkers {
public:
    // `workers` - 1 threads; the thread that calls run() is the last worker.
    explicit CallWorkers(int workers);
    ~CallWorkers();
    CallWorkers(const CallWorkers&) = delete;
    CallWorkers& operator=(const CallWorkers&) = delete;

    // task(i) for every i in [0, n), each worker taking the next index not yet taken; returns
    // when all have ended. After a task throws no new index is taken, and the first exception
    // is rethrown here. One batch at a time (a second caller waits).
    void run(size_t n, const std::function<void(size_t)>& task);

private:
    void loop();
    void take();

    std::mutex batch_;  // one run() at a time
    std::mutex m_;
    std::condition_variable start_, done_;
    std::vector<std::thread> threads_;
    const std::function<void(size_t)>* task_ = nullptr;
    size_t n_ = 0;
    std::atomic<size_t> next_{0};
    uint64_t generation_ = 0;
    size_t busy_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace ncnnport
