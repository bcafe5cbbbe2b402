# The MPI transport's test runs under mpirun with 2 and 3 processes.
if(TD_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  foreach(prog mpi_collectives mpi_faults)
    add_executable(comm_${prog} ${CMAKE_CURRENT_LIST_DIR}/${prog}.c)
    target_include_directories(comm_${prog} PRIVATE ${CMAKE_SOURCE_DIR}/src
      ${CMAKE_CURRENT_SOURCE_DIR})
    target_compile_definitions(comm_${prog} PRIVATE _GNU_SOURCE TD_HAVE_MPI)
    target_compile_options(comm_${prog} PRIVATE ${TD_WARN} -Wno-missing-prototypes)
    target_link_libraries(comm_${prog} PRIVATE tandem_static PkgConfig::CMOCKA)
  endforeach()
  add_test(NAME comm/mpi_faults_np2
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2
            $<TARGET_FILE:comm_mpi_faults>)
  set_tests_properties(comm/mpi_faults_np2 PROPERTIES LABELS comm TIMEOUT 120
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0;OMPI_MCA_btl=self,vader")
  # Process 1 stalls before starting MPI: process 0's start-up watchdog ends
  # it within 10 s, naming why, and mpirun ends the run (not a minute later).
  add_test(NAME comm/mpi_late_start
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2
            $<TARGET_FILE:comm_mpi_faults> --late)
  set_tests_properties(comm/mpi_late_start PROPERTIES LABELS comm TIMEOUT 40
    PASS_REGULAR_EXPRESSION "MPI process 0: starting MPI and joining a group of processes did not finish within 10000 ms"
    FAIL_REGULAR_EXPRESSION "went unnoticed"
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0;OMPI_MCA_btl=self,vader")
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
  # The all-reduce through MPI itself, as across machines. From 4 processes
  # Open MPI's nonblocking all-reduce changes algorithm (mpi.c, mpi_pieces).
  foreach(np 3 4)
    add_test(NAME comm/mpi_np${np}_through_mpi
      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np}
              $<TARGET_FILE:comm_mpi_collectives>)
    set_tests_properties(comm/mpi_np${np}_through_mpi PROPERTIES LABELS comm TIMEOUT 300
      ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0;OMPI_MCA_btl=self,vader;TANDEM_MPI_SHM=0")
  endforeach()
  # Two nodes of two processes, each node a network namespace (scripts/nodes):
  # the leaders' all-reduce goes over Open MPI's TCP transport on 10 Gbit/s
  # links, never through shared memory. Skipped, with the reason, where
  # namespaces cannot be made (not root, a container without privileges).
  add_test(NAME comm/mpi_nodes2
    COMMAND ${CMAKE_SOURCE_DIR}/scripts/nodes --nodes 2 --per-node 2 --timeout 240
            $<TARGET_FILE:comm_mpi_collectives> --across-nodes)
  set_tests_properties(comm/mpi_nodes2 PROPERTIES LABELS comm TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0")
  # Node 1 stalled (SIGSTOP) 4 s in: process 0 times out in MPI and names it.
  # Open MPI's mpirun then waits for node 1's daemon until scripts/nodes'
  # timeout ends everything, so the verdict is the output, not the status.
  add_test(NAME comm/mpi_nodes2_stall
    COMMAND ${CMAKE_SOURCE_DIR}/scripts/nodes --nodes 2 --timeout 15 --fault stop:1@4
            $<TARGET_FILE:comm_mpi_faults> --stall)
  set_tests_properties(comm/mpi_nodes2_stall PROPERTIES LABELS comm TIMEOUT 60
    PASS_REGULAR_EXPRESSION "named the stalled node" SKIP_REGULAR_EXPRESSION "skipped: "
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0")
endif()
