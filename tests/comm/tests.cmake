# The MPI transport's test runs under mpirun with 2 and 3 processes.
if(TD_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  add_executable(comm_mpi_collectives ${CMAKE_CURRENT_LIST_DIR}/mpi_collectives.c)
  target_include_directories(comm_mpi_collectives PRIVATE ${CMAKE_SOURCE_DIR}/src
    ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(comm_mpi_collectives PRIVATE _GNU_SOURCE TD_HAVE_MPI)
  target_compile_options(comm_mpi_collectives PRIVATE ${TD_WARN} -Wno-missing-prototypes)
  target_link_libraries(comm_mpi_collectives PRIVATE tandem_static PkgConfig::CMOCKA)
  foreach(np 2 3)
    add_test(NAME comm/mpi_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np}
              $<TARGET_FILE:comm_mpi_collectives>)
    # Under AddressSanitizer, leak checking is off for these processes only:
    # Open MPI unloads its plugins at MPI_Finalize, so the ~100 KB they keep
    # show up with "<unknown module>" stacks that no suppression can match.
    # Every other ASan check stays on; tandem's own leaks are checked by the
    # local tests, which run the same code paths.
    set_tests_properties(comm/mpi_np${np} PROPERTIES LABELS comm TIMEOUT 300
      # One machine: shared memory only. (The TCP component also trips a
      # lock-order report inside Open MPI under ThreadSanitizer.)
      ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0;OMPI_MCA_btl=self,vader")
  endforeach()
endif()
