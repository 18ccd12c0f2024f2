#include "ncnnport/huge_page_allocator.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ncnnport {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

std::atomic<uint64_t> g_live_bytes{0}, g_peak_bytes{0};

class HugePageAllocator : public ncnn::Allocator {
public:
    void* fastMalloc(size_t size) override {
#if defined(__linux__)
        // one huge page of slack, so the block can start on a 2 MiB boundary
        const size_t length = size + kHugePage;
        void* raw = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw != MAP_FAILED) {
            char* block = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) / kHugePage * kHugePage);
            madvise(block, size, MADV_HUGEPAGE);  // refused where THP is off: 4 KiB pages, same bytes
            std::lock_guard<std::mutex> lock(mutex_);
            mappings_[block] = {raw, length};
            const uint64_t live = g_live_bytes += size;
            if (live > g_peak_bytes) g_peak_bytes = live;
            return block;
        }
#endif
        return ncnn::fastMalloc(size);
    }

    void fastFree(void* ptr) override {
        if (!ptr) return;
#if defined(__linux__)
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const auto it = mappings_.find(ptr);
            if (it != mappings_.end()) {
                munmap(it->second.raw, it->second.length);
                g_live_bytes -= it->second.length - kHugePage;
                mappings_.erase(it);
                return;
            }
        }
#endif
        ncnn::fastFree(ptr);
    }

private:
    struct Mapping {
        void* raw;
        size_t length;
    };
    std::mutex mutex_;
    std::unordered_map<void*, Mapping> mappings_;  // live blocks -> the mapping each was cut from
};

}  // namespace

ncnn::Allocator* huge_page_allocator() {
    static HugePageAllocator* allocator = new HugePageAllocator;  // never deleted (see header)
    return allocator;
}

uint64_t huge_page_allocator_peak_bytes() { return g_peak_bytes.load(); }

}  // namespace ncnnport
