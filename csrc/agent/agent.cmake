# GPU agent: NVML probe (always) and the heroserve-gpu-agent daemon (when gRPC C++, protoc
# with grpc_cpp_plugin and the controller's proto are present).
add_library(heroserve_nvml STATIC agent/nvml.cc)
target_link_libraries(heroserve_nvml PUBLIC ${CMAKE_DL_LIBS})
add_executable(heroserve-nvml-probe agent/nvml_probe.cc)
target_link_libraries(heroserve-nvml-probe PRIVATE heroserve_nvml)

set(HEROSERVE_PROTO ${REPO_ROOT}/proto/heroserve/v1/control.proto)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(GRPCPP IMPORTED_TARGET grpc++)
  pkg_check_modules(PROTOBUF IMPORTED_TARGET protobuf)
endif()
find_program(PROTOC protoc)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin)
if(GRPCPP_FOUND AND PROTOBUF_FOUND AND PROTOC AND GRPC_CPP_PLUGIN AND EXISTS ${HEROSERVE_PROTO})
  set(GEN ${CMAKE_CURRENT_BINARY_DIR}/gen)
  set(GEN_SRCS ${GEN}/heroserve/v1/control.pb.cc ${GEN}/heroserve/v1/control.grpc.pb.cc)
  add_custom_command(
    OUTPUT ${GEN_SRCS} ${GEN}/heroserve/v1/control.pb.h ${GEN}/heroserve/v1/control.grpc.pb.h
    COMMAND ${CMAKE_COMMAND} -E make_directory ${GEN}
    COMMAND ${PROTOC} -I ${REPO_ROOT}/proto --cpp_out=${GEN} --grpc_out=${GEN}
            --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN} ${HEROSERVE_PROTO}
    DEPENDS ${HEROSERVE_PROTO}
    COMMENT "protoc heroserve/v1/control.proto (C++ and gRPC)")
  add_library(heroserve_proto STATIC ${GEN_SRCS})
  target_include_directories(heroserve_proto PUBLIC ${GEN})
  target_link_libraries(heroserve_proto PUBLIC PkgConfig::GRPCPP PkgConfig::PROTOBUF)
  # Generated code is not ours to fix: no -Werror on it.
  target_compile_options(heroserve_proto PRIVATE -Wno-error -w)

  add_executable(heroserve-gpu-agent agent/main.cc agent/daemon.cc agent/address.cc
                 agent/selections.cc agent/table_json.cc agent/ina_config.cc)
  target_include_directories(heroserve-gpu-agent PRIVATE agent)
  target_compile_definitions(heroserve-gpu-agent PRIVATE
    HEROSERVE_VERSION="${HEROSERVE_VERSION}")
  target_link_libraries(heroserve-gpu-agent PRIVATE heroserve_core heroserve_nvml heroserve_proto
                        heroserve_ina)
  set(HEROSERVE_HAVE_AGENT ON)
else()
  message(WARNING "heroserve-gpu-agent not built: needs grpc++ and protobuf (pkg-config), "
                  "protoc, grpc_cpp_plugin and ${HEROSERVE_PROTO}")
endif()
