// The bookkeeping both of ncnnport's own allocators share (kernel_weight_allocator.h: the weight
// arena; huge_page_allocator.h: the K/V caches' mappings): an ncnn::Allocator that serves a block
// from its own source where it can, falls back to ncnn's aligned allocation where it cannot, and
// on free tells the two apart by the blocks it handed out (a Mat may be freed by any allocator
// call path, so every pointer must go back where it came from).
#pragma once

#include <allocator.h>  // ncnn

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace ncnnport {

class OwnBlockAllocator : public ncnn::Allocator {
public:
    void* fastMalloc(size_t size) final {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (void* block = take(size)) {
                blocks_[block] = size;
                return block;
            }
        }
        return ncnn::fastMalloc(size);
    }

    void fastFree(void* ptr) final {
        if (!ptr) return;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const auto it = blocks_.find(ptr);
            if (it != blocks_.end()) {
                give_back(ptr, it->second);
                blocks_.erase(it);
                return;
            }
        }
        ncnn::fastFree(ptr);
    }

protected:
    // A block of `size` bytes from the allocator's own source, nullptr to fall back to ncnn's.
    // Both run under the allocator's lock.
    virtual void* take(size_t size) = 0;
    // Returns a block take() gave, with the size it was asked for.
    virtual void give_back(void* block, size_t size) = 0;

private:
    std::mutex mutex_;
    std::unordered_map<void*, size_t> blocks_;  // live blocks of the own source and their sizes
};

}  // namespace ncnnport
