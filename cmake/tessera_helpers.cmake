# Target helpers in the style of Abseil's absl_cc_library / absl_cc_test.
#
#   tessera_cc_library(NAME ledger HDRS ledger.h SRCS ledger.cc DEPS tessera::base absl::status)
#     -> static library tessera_ledger, alias tessera::ledger, include root src/.
#   tessera_cc_test(NAME ledger_test SRCS ledger_test.cc DEPS tessera::ledger [LABELS concurrency])
#     -> gtest binary registered with ctest (label "unit" plus any given).
#   tessera_cc_fuzz(NAME pod_devices_fuzz SRCS pod_devices_fuzz.cc DEPS tessera::device)
#     -> libFuzzer binary (only with TESSERA_BUILD_FUZZERS) and a ctest "<name>_smoke" that runs
#        it for TESSERA_FUZZ_SECONDS over a scratch corpus seeded from fuzz/corpus/<name>.

set(TESSERA_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz smoke test runs")
set(TESSERA_ONLY_TEST_LABEL "" CACHE STRING "Build only the tests with this label (empty: all)")

set(TESSERA_COPTS
  -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wcast-qual -Wformat=2 -Wimplicit-fallthrough
  -Wmissing-declarations -Wundef -Wvla)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  list(APPEND TESSERA_COPTS -Wthread-safety -Wshorten-64-to-32)
endif()
if(TESSERA_WERROR)
  list(APPEND TESSERA_COPTS -Werror)
endif()

set(TESSERA_SRC_ROOT "${PROJECT_SOURCE_DIR}/src")

# Every test compiles against one precompiled header (gtest, gmock, the standard library,
# nlohmann, cpp-httplib and the common Abseil headers), built once by `tessera_test_pch` and
# reused by each test target: parsing those headers took 4-8 s of the 10-15 s a test file
# costs. REUSE_FROM needs identical compile flags, so every test gets the same usage
# requirements (`tessera_test_common`), whatever it links.
function(tessera_setup_test_pch)
  if(NOT TESSERA_BUILD_TESTS OR TARGET tessera_test_pch)
    return()
  endif()
  add_library(tessera_test_common INTERFACE)
  target_link_libraries(tessera_test_common INTERFACE
    GTest::gmock_main nlohmann_json::nlohmann_json fmt::fmt simdjson::simdjson PkgConfig::HTTPLIB
    absl::status absl::statusor absl::strings absl::time absl::synchronization)
  target_include_directories(tessera_test_common INTERFACE "${TESSERA_SRC_ROOT}")
  set(pch_source "${CMAKE_BINARY_DIR}/tessera_test_pch.cc")
  if(NOT EXISTS "${pch_source}")
    file(WRITE "${pch_source}" "// The translation unit that builds the tests' precompiled header.\n")
  endif()
  add_library(tessera_test_pch OBJECT "${pch_source}")
  target_link_libraries(tessera_test_pch PRIVATE tessera_test_common)
  target_compile_options(tessera_test_pch PRIVATE ${TESSERA_COPTS})
  target_precompile_headers(tessera_test_pch PRIVATE
    <algorithm> <atomic> <chrono> <cstdint> <cstdlib> <functional> <map> <memory> <optional>
    <set> <string> <string_view> <thread> <utility> <vector>
    <gtest/gtest.h> <gmock/gmock.h> <nlohmann/json.hpp> <httplib.h>
    <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
    <absl/synchronization/mutex.h> <absl/time/clock.h> <absl/time/time.h>)
endfunction()

function(tessera_cc_library)
  cmake_parse_arguments(T "" "NAME" "HDRS;SRCS;DEPS" ${ARGN})
  set(target tessera_${T_NAME})
  if(T_SRCS)
    add_library(${target} STATIC ${T_SRCS} ${T_HDRS})
    target_include_directories(${target} PUBLIC "${TESSERA_SRC_ROOT}")
    target_link_libraries(${target} PUBLIC ${T_DEPS})
    target_compile_options(${target} PRIVATE ${TESSERA_COPTS})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE "${TESSERA_SRC_ROOT}")
    target_link_libraries(${target} INTERFACE ${T_DEPS})
  endif()
  add_library(tessera::${T_NAME} ALIAS ${target})
endfunction()

function(tessera_cc_test)
  if(NOT TESSERA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  # The tsan preset builds only the threaded tests (label "concurrency"): the others would run
  # nothing there, and building them doubles the time of that stage.
  if(TESSERA_ONLY_TEST_LABEL AND NOT "${T_LABELS}" STREQUAL "${TESSERA_ONLY_TEST_LABEL}")
    return()
  endif()
  add_executable(${T_NAME} ${T_SRCS})
  tessera_setup_test_pch()
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} tessera_test_common)
  target_compile_options(${T_NAME} PRIVATE ${TESSERA_COPTS})
  target_precompile_headers(${T_NAME} REUSE_FROM tessera_test_pch)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  # gtest_discover_tests splits list-valued PROPERTIES into separate words, so "unit;x" would
  # set LABELS=unit and shift every later property (TIMEOUT, ENVIRONMENT) out of place. A test
  # therefore carries exactly one label: the one given, else "unit".
  set(label unit)
  if(T_LABELS)
    list(LENGTH T_LABELS label_count)
    if(label_count GREATER 1)
      message(FATAL_ERROR "${T_NAME}: tessera_cc_test takes at most one label")
    endif()
    set(label ${T_LABELS})
  endif()
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    PROPERTIES LABELS ${label} TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "TESSERA_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

function(tessera_cc_fuzz)
  if(NOT TESSERA_BUILD_FUZZERS)
    return()
  endif()
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS})
  target_compile_options(${T_NAME} PRIVATE ${TESSERA_COPTS})
  target_include_directories(${T_NAME} PRIVATE "${TESSERA_SRC_ROOT}")
  target_link_options(${T_NAME} PRIVATE -fsanitize=fuzzer)
  set(seeds "${PROJECT_SOURCE_DIR}/fuzz/corpus/${T_NAME}")
  set(scratch "${CMAKE_BINARY_DIR}/fuzz-scratch/${T_NAME}")
  add_test(NAME ${T_NAME}_smoke
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
      bash -c "mkdir -p '${scratch}' && exec '$<TARGET_FILE:${T_NAME}>' -max_total_time=${TESSERA_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 '${scratch}' '${seeds}'")
  set_tests_properties(${T_NAME}_smoke PROPERTIES LABELS "fuzz" TIMEOUT 600)
endfunction()
