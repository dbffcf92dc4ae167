# The host side of the ZeRO step: tz_host_bench (tests/tools) times its phases beside a
# STREAM-like triad for docs/benchmarks.md; here it only runs small, on 1 and 2 ranks, so it
# keeps building and running. Timings are printed, never checked.
add_executable(tz_host_bench ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_host_bench.c)
target_compile_options(tz_host_bench PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_host_bench PRIVATE tzcore)
add_test(NAME host_bench_smoke
  COMMAND $<TARGET_FILE:tz_host_bench> --params 300000 --steps 3 --accum 2 --triad-mb 1)
set_tests_properties(host_bench_smoke PROPERTIES TIMEOUT 120 ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick")
if(MPIEXEC_EXECUTABLE)
  add_test(NAME host_bench_smoke_np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
            $<TARGET_FILE:tz_host_bench> --params 300000 --steps 3 --accum 2 --bucket-mb 0.3
            --triad-mb 0)
  set_tests_properties(host_bench_smoke_np2 PROPERTIES TIMEOUT 120 PROCESSORS 2
    ENVIRONMENT "${TZ_TEST_ENV}" LABELS "quick;mpi")
endif()
