#include <rte_config.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <ethdev_driver.h>
#include <bus_vdev_driver.h>
#include "glue.h"

unsigned mlx4rs_lcore_id(void) { return rte_lcore_id(); }
int mlx4rs_errno(void) { return rte_errno; }
void mlx4rs_set_errno(int e) { rte_errno = e; }

const char *mlx4rs_vdev_name(const struct rte_vdev_device *dev)
{
	return rte_vdev_device_name(dev);
}

const char *mlx4rs_vdev_args(const struct rte_vdev_device *dev)
{
	return rte_vdev_device_args(dev);
}

int mlx4rs_vdev_numa_node(const struct rte_vdev_device *dev)
{
	return dev->device.numa_node;
}

int mlx4rs_linkstatus_set(struct rte_eth_dev *dev, const struct rte_eth_link *link)
{
	return rte_eth_linkstatus_set(dev, link);
}

struct rte_mbuf *mlx4rs_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int mlx4rs_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void mlx4rs_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned n)
{
	rte_mempool_put_bulk(mp, objs, n);
}

/* rte_log is variadic; a fixed "%s" keeps format strings out of Rust. */
void mlx4rs_log(uint32_t level, uint32_t logtype, const char *msg)
{
	rte_log(level, logtype, "%s\n", msg);
}

uint16_t mlx4rs_pktmbuf_data_room_size(struct rte_mempool *mp)
{
	return rte_pktmbuf_data_room_size(mp);
}
