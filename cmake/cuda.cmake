# The CUDA backend (TD_WITH_CUDA=ON): every kernels/**/*.cu is compiled by nvcc into the one
# libtardelli, which then links the CUDA runtime, cuBLAS/cuBLASLt, cuDNN and NCCL.
#
# Note [CUDA architectures]: sm_80 (A100) and sm_90 (H100/H200) by default, SASS for both (no
# PTX JIT at first launch; the PTX rides along for newer GPUs). Override with
# -DCMAKE_CUDA_ARCHITECTURES=... . It must be set before enable_language(CUDA), which otherwise
# picks the compiler's own default.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for" FORCE)
endif()
# nvcc is often not on PATH; the toolkit's usual home is a good guess.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()

enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# Note [CUDA C++20]: CMake before 3.26 knows no C++20 flag for nvcc, so CUDA_STANDARD 20 (which
# CUDA sources also inherit from CXX_STANDARD) fails at generate time although nvcc >= 12
# accepts -std=c++20. Tell such a CMake the flag.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

file(GLOB_RECURSE TD_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cu)
target_sources(tardelli PRIVATE ${TD_CUDA_SOURCES})
# The target was created before CUDA was enabled, so it did not pick up CMAKE_CUDA_ARCHITECTURES
# (on a first configure it would be empty: "CUDA_ARCHITECTURES is empty for target tardelli").
set_target_properties(tardelli PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_include_directories(tardelli PRIVATE ${PROJECT_SOURCE_DIR}/kernels)
target_compile_definitions(tardelli PRIVATE TD_WITH_CUDA=1)
target_compile_options(tardelli PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${TD_WERROR}>>:-Werror=all-warnings -Xcompiler=-Werror>)

# cuDNN and NCCL ship no CMake package: look for the libraries next to the toolkit's.
find_library(TD_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_ROOT
  PATH_SUFFIXES lib lib64)
find_path(TD_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_ROOT
  PATH_SUFFIXES include)
# Note [NCCL always]: linked in every CUDA build, not only with MPI: a single process group
# over the GPUs of one node needs NCCL but no MPI (the unique id can travel another way).
find_library(TD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_ROOT
  PATH_SUFFIXES lib lib64)
find_path(TD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_ROOT
  PATH_SUFFIXES include)
foreach(var TD_CUDNN_LIBRARY TD_CUDNN_INCLUDE_DIR TD_NCCL_LIBRARY TD_NCCL_INCLUDE_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "TD_WITH_CUDA: ${var} not found (looked next to the CUDA toolkit in "
      "${CUDAToolkit_LIBRARY_DIR}; set CUDNN_ROOT / NCCL_ROOT or -D${var}=...)")
  endif()
endforeach()
target_include_directories(tardelli PRIVATE ${TD_CUDNN_INCLUDE_DIR} ${TD_NCCL_INCLUDE_DIR})
target_link_libraries(tardelli PRIVATE
  CUDA::cudart CUDA::cublasLt CUDA::cublas ${TD_CUDNN_LIBRARY} ${TD_NCCL_LIBRARY})

# Note [cuDNN frontend]: fused attention through cuDNN's SDPA graphs (Note [cuDNN attention] in
# kernels/attention/cudnn_attention.cuh) needs the cuDNN frontend, a header-only C++ library (it
# bundles its own nlohmann json). It ships in the PyPI wheel nvidia-cudnn-frontend (headers in
# site-packages/include), which scripts/setup.sh installs into .venv and scripts/gpu_deps.sh
# unpacks into .gpu-deps/cudnn-frontend for a GPU machine. Looked for, in order: the cache variable
# TD_CUDNN_FRONTEND_INCLUDE_DIR, -DCUDNN_FRONTEND_ROOT / $CUDNN_FRONTEND_ROOT, the checkout's .venv,
# .gpu-deps/cudnn-frontend, the system. Without it (or with -DTD_WITH_CUDNN_FRONTEND=OFF) the build
# still succeeds: kernels/attention/cudnn_attention.cpp compiles to "refused" plans and attention
# runs on Tardelli's own kernels, as this configure message says.
option(TD_WITH_CUDNN_FRONTEND "Fused attention through the cuDNN frontend, when its headers exist" ON)
set(TD_CUDNN_FRONTEND_MIN_VERSION 1.32)
set(TD_CUDNN_FRONTEND_SOURCE ${PROJECT_SOURCE_DIR}/kernels/attention/cudnn_attention.cpp)
target_sources(tardelli PRIVATE ${TD_CUDNN_FRONTEND_SOURCE})
set(TD_CUDNN_FRONTEND_USED OFF)
if(TD_WITH_CUDNN_FRONTEND)
  file(GLOB TD_VENV_SITE_PACKAGES ${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages)
  find_path(TD_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
    HINTS ${CUDNN_FRONTEND_ROOT} ENV CUDNN_FRONTEND_ROOT ${TD_VENV_SITE_PACKAGES}
      ${PROJECT_SOURCE_DIR}/.gpu-deps/cudnn-frontend
    PATH_SUFFIXES include)
  if(TD_CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS ${TD_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h)
    file(STRINGS ${TD_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h td_fe_lines
      REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION [0-9]+")
    string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*" "\\1" td_fe_major "${td_fe_lines}")
    string(REGEX REPLACE ".*MINOR_VERSION ([0-9]+).*" "\\1" td_fe_minor "${td_fe_lines}")
    string(REGEX REPLACE ".*PATCH_VERSION ([0-9]+).*" "\\1" td_fe_patch "${td_fe_lines}")
    set(TD_CUDNN_FRONTEND_VERSION "${td_fe_major}.${td_fe_minor}.${td_fe_patch}")
    if(TD_CUDNN_FRONTEND_VERSION VERSION_GREATER_EQUAL TD_CUDNN_FRONTEND_MIN_VERSION)
      set(TD_CUDNN_FRONTEND_USED ON)
    else()
      message(WARNING "cuDNN frontend ${TD_CUDNN_FRONTEND_VERSION} in "
        "${TD_CUDNN_FRONTEND_INCLUDE_DIR} is older than ${TD_CUDNN_FRONTEND_MIN_VERSION}: the cuDNN "
        "attention path is compiled out (bash scripts/setup.sh installs a recent one into .venv)")
    endif()
  else()
    message(WARNING "cuDNN frontend headers (cudnn_frontend.h) not found: the cuDNN attention "
      "path is compiled out and attention runs on Tardelli's own kernels. bash scripts/setup.sh "
      "installs them into .venv (pip: nvidia-cudnn-frontend); or pass -DCUDNN_FRONTEND_ROOT=...")
  endif()
endif()
if(TD_CUDNN_FRONTEND_USED)
  # -isystem: the frontend's own warnings are not ours to fix (the build uses -Werror).
  set_source_files_properties(${TD_CUDNN_FRONTEND_SOURCE} PROPERTIES
    COMPILE_DEFINITIONS TD_WITH_CUDNN_FRONTEND=1
    COMPILE_OPTIONS "-isystem;${TD_CUDNN_FRONTEND_INCLUDE_DIR}")
  # The frontend's runtime-compiled engines (NVRTC) are referenced by its headers even when unused.
  target_link_libraries(tardelli PRIVATE CUDA::nvrtc)
  set(td_fe_note "cuDNN frontend ${TD_CUDNN_FRONTEND_VERSION} (${TD_CUDNN_FRONTEND_INCLUDE_DIR})")
else()
  set_source_files_properties(${TD_CUDNN_FRONTEND_SOURCE} PROPERTIES
    COMPILE_DEFINITIONS TD_WITH_CUDNN_FRONTEND=0)
  set(td_fe_note "no cuDNN frontend (attention: own kernels only)")
endif()

message(STATUS "Tardelli CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
  "architectures ${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${TD_CUDNN_LIBRARY}, NCCL ${TD_NCCL_LIBRARY}, "
  "${td_fe_note}")
