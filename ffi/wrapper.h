/* Everything the driver and its apps use from DPDK's installed (public) headers. The driver
 * SDK's items come from the committed bindings of the release (sdk.h, sdk/v*.rs). */
#include <rte_config.h>
#include <rte_common.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_malloc.h>
#include <rte_memory.h>
#include <rte_memzone.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_tcp.h>
#include <rte_udp.h>
#include <rte_kvargs.h>
#include <rte_ethdev.h>
#include <rte_bus_vdev.h>
#include <rte_flow.h>
#include <rte_bus_pci.h>
#include <rte_devargs.h>
#include <rte_interrupts.h>
#include "glue.h"
