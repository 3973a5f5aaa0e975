# XGrammar's C++ core, the structured-output grammar engine (grammar/), as
# the imported target xgrammar::xgrammar: a static library that
# tools/build_xgrammar.sh builds from the pinned PyPI sdist into
# build-deps/xgrammar-VER/gcc/ (deploy/setup.sh runs it). The version is
# the script's pin. Every build links that one archive, clang's sanitizer
# builds too: it holds no LTO objects, and both compilers use libstdc++'s
# ABI; like Debian's libraries, it is not instrumented.
file(STRINGS ${CMAKE_SOURCE_DIR}/tools/build_xgrammar.sh _xg_pin
     REGEX "^XGRAMMAR_VERSION=")
string(REGEX REPLACE "^XGRAMMAR_VERSION=" "" KVSERVE_XGRAMMAR_VERSION
       "${_xg_pin}")
set(KVSERVE_XGRAMMAR_PREFIX
    "${CMAKE_SOURCE_DIR}/build-deps/xgrammar-${KVSERVE_XGRAMMAR_VERSION}/gcc"
    CACHE PATH "XGrammar's install prefix (tools/build_xgrammar.sh)")
set(_xg_lib "${KVSERVE_XGRAMMAR_PREFIX}/lib/libxgrammar.a")
if(NOT EXISTS "${_xg_lib}")
  message(FATAL_ERROR
    "XGrammar ${KVSERVE_XGRAMMAR_VERSION} is not built (no ${_xg_lib}): "
    "run deploy/setup.sh, or tools/build_xgrammar.sh")
endif()
add_library(xgrammar::xgrammar STATIC IMPORTED)
set_target_properties(xgrammar::xgrammar PROPERTIES
  IMPORTED_LOCATION "${_xg_lib}"
  INTERFACE_INCLUDE_DIRECTORIES "${KVSERVE_XGRAMMAR_PREFIX}/include"
  INTERFACE_COMPILE_DEFINITIONS
    "XGRAMMAR_ENABLE_CPPTRACE=0;XGRAMMAR_ENABLE_INTERNAL_CHECK=0")
message(STATUS "XGrammar ${KVSERVE_XGRAMMAR_VERSION}: ${KVSERVE_XGRAMMAR_PREFIX}")
