// Stand-in for macOS's <mach-o/dyld.h> (scripts/metal-check.sh): the one
// declaration common/metal_launch.cpp uses.
#pragma once

#include <cstdint>

extern "C" int _NSGetExecutablePath(char* buf, uint32_t* bufsize);
