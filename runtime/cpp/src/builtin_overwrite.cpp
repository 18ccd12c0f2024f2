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

}  // namespace ncnnport
