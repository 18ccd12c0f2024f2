#include "ncnnport/builtin_overwrite.h"

#include <cstdio>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#define NCNNPORT_QUIET_STDERR 1
#else
#define NCNNPORT_QUIET_STDERR 0
#endif

namespace ncnnport {

bool register_overwrite_quietly(ncnn::Net& net, const char* type, ncnn::layer_creator_func creator,
                                ncnn::layer_destroyer_func destroyer) {
#if NCNNPORT_QUIET_STDERR
    std::fflush(stderr);
    const int saved = dup(STDERR_FILENO);
    const int null_fd = open("/dev/null", O_WRONLY);
    if (saved >= 0 && null_fd >= 0) dup2(null_fd, STDERR_FILENO);
#endif
    const int ret = net.register_custom_layer(type, creator, destroyer);
#if NCNNPORT_QUIET_STDERR
    std::fflush(stderr);
    if (saved >= 0 && null_fd >= 0) dup2(saved, STDERR_FILENO);
    if (saved >= 0) close(saved);
    if (null_fd >= 0) close(null_fd);
#endif
    return ret == 0;
}

void adopt_builtin_flags(ncnn::Layer& overwrite, const ncnn::Layer& builtin) {
    overwrite.support_packing = builtin.support_packing;
    overwrite.support_bf16_storage = builtin.support_bf16_storage;
    overwrite.support_fp16_storage = builtin.support_fp16_storage;
    overwrite.support_int8_storage = builtin.support_int8_storage;
    overwrite.support_any_packing = builtin.support_any_packing;
    overwrite.support_batch = builtin.support_batch;
}

}  // namespace ncnnport
