#include "ncnnport/kernel_weight_allocator.h"

#include "ncnnport/own_block_allocator.h"

#include <atomic>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace ncnnport {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kReserve = size_t{64} << 30;  // address space only (MAP_NORESERVE): pages exist once written
constexpr size_t kAlign = 64;

std::atomic<uint64_t> g_huge_bytes{0};

class KernelWeightAllocator : public OwnBlockAllocator {
protected:
    void* take(size_t size) override {
#if defined(__linux__)
        if (reserve()) {
            const size_t offset = (used_ + kAlign - 1) / kAlign * kAlign;
            if (offset + size <= kReserve) {
                used_ = offset + size;
                g_huge_bytes += size;
                return base_ + offset;
            }
        }
#else
        (void)size;
#endif
        return nullptr;
    }

    void give_back(void* block, size_t size) override {
#if defined(__linux__)
        // the whole 4 KiB pages inside the block go back to the system; its address range is not reused
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        const uintptr_t begin = (reinterpret_cast<uintptr_t>(block) + page - 1) / page * page;
        const uintptr_t end = (reinterpret_cast<uintptr_t>(block) + size) / page * page;
        if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
        g_huge_bytes -= size;
#else
        (void)block;
        (void)size;
#endif
    }

private:
#if defined(__linux__)
    // The arena's address range, reserved once, 2 MiB-aligned and marked MADV_HUGEPAGE; false
    // (every request then takes ncnn's allocation) where the system refuses the reservation.
    bool reserve() {
        if (base_) return true;
        if (failed_) return false;
        void* raw = mmap(nullptr, kReserve + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) {
            failed_ = true;
            return false;
        }
        base_ = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) / kHugePage * kHugePage);
        madvise(base_, kReserve, MADV_HUGEPAGE);  // refused where THP is off: 4 KiB pages, same bytes
        return true;
    }

    char* base_ = nullptr;
    bool failed_ = false;
    size_t used_ = 0;
#endif
};

}  // namespace

ncnn::Allocator* kernel_weight_allocator() {
    static KernelWeightAllocator* allocator = new KernelWeightAllocator;  // never deleted (see header)
    return allocator;
}

uint64_t kernel_weight_huge_bytes() { return g_huge_bytes.load(); }

}  // namespace ncnnport
