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
    # Open MPI keeps some allocations until exit; LeakSanitizer would report them.
    set_tests_properties(comm/mpi_np${np} PROPERTIES LABELS comm TIMEOUT 300
      ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/lsan-mpi.supp:print_suppressions=0")
  endforeach()
endif()
