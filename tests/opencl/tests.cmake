# PoCL leaks a few bytes the first time a process builds a kernel that its
# cache lacks (pocl-lsan.supp), so under AddressSanitizer a test's result
# would depend on which kernels an earlier run left in the cache. Every
# OpenCL test program runs with that suppression; it names only libpocl.
file(GLOB TD_OPENCL_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.c)
foreach(src ${TD_OPENCL_TESTS})
  get_filename_component(name ${src} NAME_WE)
  set_property(TEST opencl/${name} APPEND PROPERTY ENVIRONMENT
    "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/pocl-lsan.supp")
endforeach()
