/* The driver SDK: the headers DPDK does not install, whose bindings are committed per release
 * (ffi/sdk/v*.rs, made by scripts/gen-sdk-bindings.sh). Only what these files define is taken;
 * the types they use from the public headers come from the build's own bindgen run over the
 * installed copy (wrapper.h). */
#include <rte_config.h>
#include <ethdev_driver.h>
#include <rte_flow_driver.h>
#include <bus_vdev_driver.h>
#include <bus_pci_driver.h>
