# CUDA support (option KVSERVE_CUDA, on when nvcc is found). Only models/cuda/
# (library kvserve_cuda) and engine/runner/ see CUDA; kvcache/ and scheduler/ never
# do. Included from the top-level CMakeLists.txt before the subdirectories.
include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
   AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
set(_kvserve_cuda_default OFF)
if(CMAKE_CUDA_COMPILER)
  set(_kvserve_cuda_default ON)
endif()
option(KVSERVE_CUDA "Build the CUDA backend (needs nvcc; runs without a GPU)"
       ${_kvserve_cuda_default})

# The same backend compiled by the host compiler against the SIMT emulator
# (tests/support/cuda_emu/): the kernels run on the CPU, so the `gpu` tests run
# where no GPU exists (the sanitizer build of CI). Needs only the CUDA headers.
option(KVSERVE_CUDA_EMU
       "Build the CUDA backend against the CPU SIMT emulator (testing)" OFF)
if(KVSERVE_CUDA AND KVSERVE_CUDA_EMU)
  message(FATAL_ERROR "KVSERVE_CUDA and KVSERVE_CUDA_EMU exclude each other")
endif()
if(KVSERVE_CUDA_EMU)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "kvserve: CUDA backend on the SIMT emulator (CPU)")
endif()

if(KVSERVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "KVSERVE_CUDA=ON but no CUDA compiler was found: "
                        "set CMAKE_CUDA_COMPILER or put nvcc on PATH")
  endif()
  # 80: A100; 90: H100/H200 (sm_90 machine code, no PTX JIT at start).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  if(CCACHE_PROGRAM)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${kvserve_ccache})
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 has no CUDA20 flags for nvcc 13
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "kvserve: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "kvserve: CUDA backend OFF")
endif()

# kvserve_cuda_library(): models/cuda/*.cu and *.cc as one static library
# on top of kvserve_loader. Called from models/CMakeLists.txt.
function(kvserve_cuda_library)
  file(GLOB cu_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cu)
  file(GLOB cc_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cc)
  if(KVSERVE_CUDA_EMU)
    kvserve_cuda_emu_library("${cu_srcs}" "${cc_srcs}")
    return()
  endif()
  add_library(kvserve_cuda STATIC ${cu_srcs} ${cc_srcs})
  target_include_directories(kvserve_cuda PUBLIC ${CMAKE_SOURCE_DIR})
  # cuBLAS is opened at run time (models/cuda/cublas_loader.cc), not
  # linked: a CPU run of the binary never maps it.
  target_link_libraries(kvserve_cuda PUBLIC kvserve_loader kvserve_model_core CUDA::cudart
                        ${CMAKE_DL_LIBS})
  target_compile_definitions(kvserve_cuda PUBLIC KVSERVE_CUDA=1)
  set(_cublas_soname "libcublas.so.${CUDAToolkit_VERSION_MAJOR}")
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/cuda/cublas_loader.cc
    PROPERTIES COMPILE_DEFINITIONS
    "KVSERVE_CUBLAS_SONAME=\"${_cublas_soname}\";KVSERVE_CUBLAS_PATH=\"${CUDAToolkit_LIBRARY_DIR}/${_cublas_soname}\"")
  # The directory's host flags (-march=native, -Wextra, sanitizers) are not
  # nvcc flags: keep them for the .cc files only.
  get_target_property(dir_opts kvserve_cuda COMPILE_OPTIONS)
  set_property(TARGET kvserve_cuda PROPERTY COMPILE_OPTIONS "")
  foreach(opt IN LISTS dir_opts)
    target_compile_options(kvserve_cuda PRIVATE
                           $<$<COMPILE_LANGUAGE:CXX>:${opt}>)
  endforeach()
  target_compile_options(kvserve_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  set_target_properties(kvserve_cuda PROPERTIES
    CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
endfunction()

# The emulated kvserve_cuda: the .cu files compiled as C++ with
# tests/support/cuda_emu/simt.h force-included, plus the emulator's runtime and
# cuBLAS subset instead of libcudart and libcublas. It also defines
# KVSERVE_CUDA, so the engine and the `gpu` tests use it like the real one.
function(kvserve_cuda_emu_library cu_srcs cc_srcs)
  file(GLOB emu_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/support/cuda_emu/*.cc)
  set(emu_opts
      "-xc++;-include;${CMAKE_SOURCE_DIR}/tests/support/cuda_emu/simt.h;-Wno-unknown-pragmas")
  set_source_files_properties(${cu_srcs} PROPERTIES LANGUAGE CXX
    COMPILE_OPTIONS "${emu_opts}")
  # The GEMM stand-in is the emulator's hot loop and not code under test:
  # optimized and uninstrumented even in sanitizer builds (its arguments are
  # validated like cuBLAS validates them).
  set_source_files_properties(${CMAKE_SOURCE_DIR}/tests/support/cuda_emu/cublas.cc
    PROPERTIES COMPILE_OPTIONS "-O3;-fno-sanitize=all")
  add_library(kvserve_cuda STATIC ${cu_srcs} ${cc_srcs} ${emu_srcs})
  target_include_directories(kvserve_cuda PUBLIC ${CMAKE_SOURCE_DIR})
  target_include_directories(kvserve_cuda SYSTEM PUBLIC
                             ${CUDAToolkit_INCLUDE_DIRS})
  find_package(Boost 1.74 REQUIRED COMPONENTS context)
  target_link_libraries(kvserve_cuda PUBLIC kvserve_loader kvserve_model_core
                        PRIVATE Boost::context)
  target_compile_definitions(kvserve_cuda PUBLIC KVSERVE_CUDA=1
                             KVSERVE_CUDA_EMU=1)
endfunction()
