# Sourced by the scripts of one GPU call: exports CXX, the C++ compiler of every build in the call.
# The image's default CXX (/opt/gcc/bin/g++ wrapper) links no shared libstdc++: C++ errors then
# crash. Our build, DAIN's (in the flow benchmark too) and what the tests and benchmarks compile
# (AOTInductor packages, whose .so built by the wrapper crashes when loaded; the C++ example) use
# /usr/bin/g++. CXX_OVERRIDE chooses another.
export CXX="${CXX_OVERRIDE:-$( [ -x /usr/bin/g++ ] && echo /usr/bin/g++ || echo "${CXX:-c++}")}"
