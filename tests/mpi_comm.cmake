# MPI layer: tz_comm_check under mpirun at 1-4 ranks (world, every collective vs local sums), and
# one rank's TZ_FATAL stopping every rank without a hang (mpi_fatal.sh). Plan: unit/test_zero_plan.
add_executable(tz_comm_check ${CMAKE_CURRENT_SOURCE_DIR}/tools/tz_comm_check.c)
target_compile_options(tz_comm_check PRIVATE ${TZ_WARN} ${TZ_OPT})
target_link_libraries(tz_comm_check PRIVATE tzcore)

if(NOT MPIEXEC_EXECUTABLE)
  message(WARNING "no mpiexec found: the mpi_comm_* and mpi_fatal tests are not added")
  return()
endif()
set(TZ_MPI_ENV "${TZ_TEST_ENV}")
foreach(np 1 2 3 4)
  add_test(NAME mpi_comm_np${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:tz_comm_check> ${MPIEXEC_POSTFLAGS}
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(mpi_comm_np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np}
    ENVIRONMENT "${TZ_MPI_ENV}" FAIL_REGULAR_EXPRESSION "FAIL " LABELS "quick;mpi")
endforeach()
add_test(NAME mpi_fatal_one_rank
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mpi_fatal.sh ${MPIEXEC_EXECUTABLE}
          ${MPIEXEC_NUMPROC_FLAG} $<TARGET_FILE:tz_comm_check>
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(mpi_fatal_one_rank PROPERTIES TIMEOUT 200 PROCESSORS 3
  ENVIRONMENT "${TZ_MPI_ENV}" LABELS "quick;mpi")
