# cmake --install: what a host needs to run ckptd and what a trainer needs to link its client.
#   bin/             ckptd, ckpt-coordinator, ckptctl
#   lib/             libckpt_client.so (the project's code inside; protobuf and spdlog shared)
#   lib/pkgconfig/   ckpt-client.pc      (pkg-config --cflags --libs ckpt-client)
#   include/ckpt/    client.h, launch_env.h, status.h  (they include nothing else of the project)
#   lib/systemd/system/  ckptd.service, ckpt-coordinator.service (ExecStart names /usr/local/bin:
#                        the default prefix; edit them for another)
#   lib/sysusers.d/  ckptd.conf          (the ckptd system user)
#   share/ckptd/     ckptd.yaml          (the example config: copy to /etc/ckptd/ckptd.yaml)
# Checked by tests/install/check_install.sh, which installs into a temporary prefix and builds a
# trainer against it.
include(GNUInstallDirs)

install(TARGETS ckptd ckpt-coordinator ckptctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ckpt_client_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES client/include/ckpt/client.h client/include/ckpt/launch_env.h client/include/ckpt/status.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ckpt)
file(RELATIVE_PATH CKPT_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")  # "../.."
configure_file(cmake/ckpt-client.pc.in ${CMAKE_BINARY_DIR}/ckpt-client.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/ckpt-client.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES deploy/systemd/ckptd.service deploy/systemd/ckpt-coordinator.service
        DESTINATION lib/systemd/system)
install(FILES deploy/systemd/ckptd.sysusers DESTINATION lib/sysusers.d RENAME ckptd.conf)
install(FILES deploy/ckptd.yaml DESTINATION ${CMAKE_INSTALL_DATADIR}/ckptd)
