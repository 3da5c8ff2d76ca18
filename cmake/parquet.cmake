# Included from CMakeLists.txt after meshtrain_data is declared.
# Parquet sources (data/records/parquet_text.cpp): Arrow's C++ Parquet library, optional. Debian 12 has no Arrow
# C++; `scripts/setup.sh parquet` puts the pyarrow wheel, which ships Arrow's headers and libraries, into build/venv
# (docs/parquet.md says why). An Arrow C++ installed system-wide is found too. MESHTRAIN_PARQUET: AUTO builds it
# where found, ON requires it, OFF leaves it out; without it, reading a Parquet file is an error saying how to
# get it. The venv's libraries are linked by full path, so the build-tree RPATH names their folder.
set(MESHTRAIN_PARQUET AUTO CACHE STRING "Read Parquet sources with Arrow's C++ library: AUTO, ON or OFF")
set(MESHTRAIN_PARQUET_PYTHON "${CMAKE_SOURCE_DIR}/build/venv/bin/python3" CACHE FILEPATH
    "A Python whose pyarrow wheel holds Arrow's C++ headers and libraries (scripts/setup.sh parquet)")
set(MESHTRAIN_WITH_PARQUET OFF)
if(NOT MESHTRAIN_PARQUET STREQUAL "OFF")
  set(pyarrow_folders "")
  if(EXISTS "${MESHTRAIN_PARQUET_PYTHON}")
    execute_process(COMMAND "${MESHTRAIN_PARQUET_PYTHON}" -c
                    "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
                    OUTPUT_VARIABLE pyarrow_folders OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" pyarrow_folders "${pyarrow_folders}")
  endif()
  find_path(MESHTRAIN_PARQUET_INCLUDE parquet/api/reader.h HINTS ${pyarrow_folders})
  find_library(MESHTRAIN_PARQUET_LIBRARY parquet HINTS ${pyarrow_folders})
  find_library(MESHTRAIN_ARROW_LIBRARY arrow HINTS ${pyarrow_folders})
  if(MESHTRAIN_PARQUET_INCLUDE AND MESHTRAIN_PARQUET_LIBRARY AND MESHTRAIN_ARROW_LIBRARY)
    set(MESHTRAIN_WITH_PARQUET ON)
    message(STATUS "Parquet: Arrow's C++ library at ${MESHTRAIN_PARQUET_LIBRARY}")
  elseif(MESHTRAIN_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "MESHTRAIN_PARQUET=ON but Arrow's C++ library was not found (headers: "
            "${MESHTRAIN_PARQUET_INCLUDE}, libparquet: ${MESHTRAIN_PARQUET_LIBRARY}, libarrow: "
            "${MESHTRAIN_ARROW_LIBRARY}): run scripts/setup.sh parquet, or set MESHTRAIN_PARQUET=AUTO")
  else()
    message(STATUS "Parquet: Arrow's C++ library not found, Parquet sources not built (scripts/setup.sh parquet)")
  endif()
endif()
if(MESHTRAIN_WITH_PARQUET)
  # SYSTEM: Arrow's headers trip -Wshadow, and warnings are errors.
  target_include_directories(meshtrain_data SYSTEM PRIVATE ${MESHTRAIN_PARQUET_INCLUDE})
  target_link_libraries(meshtrain_data PRIVATE ${MESHTRAIN_PARQUET_LIBRARY} ${MESHTRAIN_ARROW_LIBRARY})
endif()
target_compile_definitions(meshtrain_data PRIVATE MESHTRAIN_WITH_PARQUET=$<BOOL:${MESHTRAIN_WITH_PARQUET}>)
