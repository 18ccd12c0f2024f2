#include "ncnnport/concurrent_calls.h"

#include <stdexcept>
#include <string>

namespace ncnnport {

CallSplit split_threads(int threads, int concurrent_calls) {
    if (threads < 1 || concurrent_calls < 1)
        throw std::invalid_argument("split_threads: threads=" + std::to_string(threads)
                                    + ", concurrent_calls=" + std::to_string(concurrent_calls));
    const int each = (threads + concurrent_calls - 1) / concurrent_calls;
    return {threads / each, each};
}

CallWorkers::CallWorkers(int workers) {
    for (int i = 1; i < workers; ++i) threads_.emplace_back([this] { loop(); });
}

CallWorkers::~CallWorkers() {
    {
        std::lock_guard<std::mutex> lock(m_);
        stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
}

void CallWorkers::take() {
    for (size_t i = next_++; i < n_; i = next_++) {
        try {
            (*task_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(m_);
            if (!error_) error_ = std::current_exception();
            next_ = n_;
        }
    }
}

void CallWorkers::loop() {
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lock(m_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        lock.unlock();
        take();
        lock.lock();
        if (--busy_ == 0) done_.notify_all();
    }
}

void CallWorkers::run(size_t n, const std::function<void(size_t)>& task) {
    std::lock_guard<std::mutex> batch(batch_);
    {
        std::lock_guard<std::mutex> lock(m_);
        task_ = &task;
        n_ = n;
        next_ = 0;
        error_ = nullptr;
        busy_ = threads_.size();
        ++generation_;
    }
    start_.notify_all();
    take();
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return busy_ == 0; });
    task_ = nullptr;
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

}  // namespace ncnnport
