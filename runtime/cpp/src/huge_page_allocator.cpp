#include "ncnnport/huge_page_allocator.h"

#include "ncnnport/own_block_allocator.h"

#include <atomic>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace ncnnport {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

std::atomic<uint64_t> g_live_bytes{0}, g_peak_bytes{0};

class HugePageAllocator : public OwnBlockAllocator {
protected:
    void* take(size_t size) override {
#if defined(__linux__)
        // a mapping one huge page longer, trimmed to a 2 MiB-aligned block of whole pages
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        const size_t length = (size + page - 1) / page * page;
        void* raw = mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) return nullptr;
        char* begin = static_cast<char*>(raw);
        char* block = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) / kHugePage * kHugePage);
        if (block > begin) munmap(begin, static_cast<size_t>(block - begin));
        const size_t tail = static_cast<size_t>(begin + length + kHugePage - (block + length));
        if (tail > 0) munmap(block + length, tail);
        madvise(block, length, MADV_HUGEPAGE);  // refused where THP is off: 4 KiB pages, same bytes
        const uint64_t live = g_live_bytes += size;
        if (live > g_peak_bytes) g_peak_bytes = live;
        return block;
#else
        (void)size;
        return nullptr;
#endif
    }

    void give_back(void* block, size_t size) override {
#if defined(__linux__)
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        munmap(block, (size + page - 1) / page * page);
        g_live_bytes -= size;
#else
        (void)block;
        (void)size;
#endif
    }
};

}  // namespace

ncnn::Allocator* huge_page_allocator() {
    static HugePageAllocator* allocator = new HugePageAllocator;  // never deleted (see header)
    return allocator;
}

uint64_t huge_page_allocator_peak_bytes() { return g_peak_bytes.load(); }

}  // namespace ncnnport
