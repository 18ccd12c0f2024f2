# Cross-compile for 64-bit Arm Linux with Debian's cross compiler (g++-aarch64-linux-gnu).
#
# Libraries come from Debian multiarch (`dpkg --add-architecture arm64`; libssl-dev:arm64,
# libicu-dev:arm64, libpcre2-dev:arm64, libzip-dev:arm64): Debian's cross gcc searches
# /usr/include/aarch64-linux-gnu and /usr/lib/aarch64-linux-gnu itself, so no sysroot is built.
# Executables run under qemu-user: `qemu-aarch64 -L /usr/aarch64-linux-gnu` (the cross libc).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)

# Find the target's libraries and headers only (never the host's x86 copies); programs
# (cmake, pkg-config) are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config (pcre2, libzip): the arm64 .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
