# Third-party packages, all from Debian 12 (or a prefix unpacked from them).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
# The server's history of recorded runs (server/history).
find_package(SQLite3 REQUIRED)
# CMake 3.25's FindSQLite3 names its target SQLite::SQLite3; newer ones
# SQLite3::SQLite3 (the old name deprecated).
if(TARGET SQLite3::SQLite3)
  set(LOGITD_SQLITE SQLite3::SQLite3)
else()
  set(LOGITD_SQLITE SQLite::SQLite3)
endif()
# PostgreSQL's client library (Debian's libpq-dev), for a history several
# replicas share (--history=postgresql://…). Optional: a logitd built without
# it says so when asked for PostgreSQL; LOGITD_REQUIRE_POSTGRESQL (the ci
# preset's) makes it required, so the test suite always runs against it.
option(LOGITD_REQUIRE_POSTGRESQL "Fail unless libpq is found" OFF)
find_path(LIBPQ_INCLUDE_DIR libpq-fe.h PATH_SUFFIXES postgresql)
find_library(LIBPQ_LIBRARY NAMES pq)
if(LIBPQ_INCLUDE_DIR AND LIBPQ_LIBRARY)
  set(LOGITD_HAVE_LIBPQ ON)
  if(NOT TARGET logitd_libpq)
    add_library(logitd_libpq UNKNOWN IMPORTED)
    set_target_properties(logitd_libpq PROPERTIES IMPORTED_LOCATION "${LIBPQ_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${LIBPQ_INCLUDE_DIR}")
  endif()
elseif(LOGITD_REQUIRE_POSTGRESQL)
  message(FATAL_ERROR "libpq (libpq-dev) not found; scripts/bootstrap.sh installs it")
else()
  set(LOGITD_HAVE_LIBPQ OFF)
  message(STATUS "libpq not found: --history=postgresql:// is not built in")
endif()
# Metrics: prometheus-cpp's core (metric types and the text format; its CMake
# package also looks for civetweb and curl, which logitd does not link) and
# GNU libmicrohttpd for the HTTP endpoint (a header and a library, no CMake
# package).
find_package(prometheus-cpp CONFIG REQUIRED)
find_path(MICROHTTPD_INCLUDE_DIR microhttpd.h REQUIRED)
find_library(MICROHTTPD_LIBRARY NAMES microhttpd REQUIRED)
if(NOT TARGET logitd_microhttpd)
  add_library(logitd_microhttpd UNKNOWN IMPORTED)
  set_target_properties(logitd_microhttpd PROPERTIES IMPORTED_LOCATION "${MICROHTTPD_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${MICROHTTPD_INCLUDE_DIR}")
endif()

# xxHash: Debian ships a library and a header, no CMake package.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY NAMES xxhash REQUIRED)
if(NOT TARGET xxhash::xxhash)
  add_library(xxhash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxhash::xxhash PROPERTIES IMPORTED_LOCATION "${XXHASH_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
endif()
# Debian's library also exports XXH3's runtime-dispatched entry points
# (xxh_x86dispatch.h: AVX2 or AVX-512 where the CPU has them, the same
# digests), about three times faster on a 128 MiB tensor than the SSE2 build's
# plain ones. Used where present.
include(CheckSymbolExists)
set(CMAKE_REQUIRED_INCLUDES "${XXHASH_INCLUDE_DIR}")
set(CMAKE_REQUIRED_LIBRARIES "${XXHASH_LIBRARY}")
check_symbol_exists(XXH3_64bits_dispatch "xxhash.h;xxh_x86dispatch.h" LOGITD_HAVE_XXH_DISPATCH)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)

# OpenBLAS for the cpu backend: its cblas.h lives in a per-variant folder on Debian.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_CBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES openblas-pthread x86_64-linux-gnu/openblas-pthread openblas
                        x86_64-linux-gnu/openblas-openmp
          REQUIRED)
if(NOT TARGET logitd_openblas)
  add_library(logitd_openblas INTERFACE)
  target_link_libraries(logitd_openblas INTERFACE BLAS::BLAS)
  target_include_directories(logitd_openblas SYSTEM INTERFACE "${OPENBLAS_CBLAS_INCLUDE_DIR}")
endif()
