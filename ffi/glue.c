#include <stddef.h>
#include <rte_config.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ethdev.h>
#include "glue.h"

unsigned mlx4rs_lcore_id(void) { return rte_lcore_id(); }
int mlx4rs_errno(void) { return rte_errno; }
void mlx4rs_set_errno(int e) { rte_errno = e; }

struct rte_mbuf *mlx4rs_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int mlx4rs_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

/* The objects alone, in the state a pktmbuf pool keeps them (reference count 1, one segment,
 * no next): an RX refill writes the fields a reset would as it hands each one up. */
int mlx4rs_mbuf_raw_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_mempool_get_bulk(mp, (void **)mbufs, count);
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

/* The values behind the RTE_BIT64/RTE_BIT32 macros that src/lib.rs restates in `bits`, taken
 * from the headers by the compiler, so a test can hold the Rust constants against them. */
#define MLX4RS_BIT(name) { #name, (uint64_t)(name) }
const struct mlx4rs_named_bit mlx4rs_header_bits[] = {
	MLX4RS_BIT(RTE_ETH_LINK_SPEED_40G),
	MLX4RS_BIT(RTE_ETH_DEV_AUTOFILL_QUEUE_XSTATS),
	MLX4RS_BIT(RTE_ETH_DEV_INTR_LSC),
	MLX4RS_BIT(RTE_ETH_DEV_INTR_RMV),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_VLAN_FILTER),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_TCP_TSO),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_OUTER_IPV4_CKSUM),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_OUTER_IPV4_CKSUM),
	MLX4RS_BIT(RTE_MBUF_F_TX_TCP_SEG),
	MLX4RS_BIT(RTE_MBUF_F_TX_TUNNEL_MASK),
	MLX4RS_BIT(RTE_MBUF_F_TX_OUTER_IP_CKSUM),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_VLAN_INSERT),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_IPV4_CKSUM),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_UDP_CKSUM),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_TCP_CKSUM),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_MULTI_SEGS),
	MLX4RS_BIT(RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_IPV4_CKSUM),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_UDP_CKSUM),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_TCP_CKSUM),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_SCATTER),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_KEEP_CRC),
	MLX4RS_BIT(RTE_ETH_RX_OFFLOAD_RSS_HASH),
	MLX4RS_BIT(RTE_ETH_RSS_IPV4),
	MLX4RS_BIT(RTE_ETH_RSS_FRAG_IPV4),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV4_TCP),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV4_UDP),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV4_OTHER),
	MLX4RS_BIT(RTE_ETH_RSS_IPV6),
	MLX4RS_BIT(RTE_ETH_RSS_FRAG_IPV6),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV6_TCP),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV6_UDP),
	MLX4RS_BIT(RTE_ETH_RSS_NONFRAG_IPV6_OTHER),
	MLX4RS_BIT(RTE_MBUF_F_RX_RSS_HASH),
	MLX4RS_BIT(RTE_MBUF_F_RX_L4_CKSUM_BAD),
	MLX4RS_BIT(RTE_MBUF_F_RX_IP_CKSUM_BAD),
	MLX4RS_BIT(RTE_MBUF_F_RX_IP_CKSUM_GOOD),
	MLX4RS_BIT(RTE_MBUF_F_RX_L4_CKSUM_GOOD),
	MLX4RS_BIT(RTE_MBUF_F_TX_TCP_CKSUM),
	MLX4RS_BIT(RTE_MBUF_F_TX_UDP_CKSUM),
	MLX4RS_BIT(RTE_MBUF_F_TX_L4_MASK),
	MLX4RS_BIT(RTE_MBUF_F_TX_IP_CKSUM),
	MLX4RS_BIT(RTE_MBUF_F_TX_IPV4),
	MLX4RS_BIT(RTE_MBUF_F_TX_IPV6),
	MLX4RS_BIT(RTE_MBUF_F_TX_VLAN),
};
const unsigned mlx4rs_header_bits_n = sizeof(mlx4rs_header_bits) / sizeof(mlx4rs_header_bits[0]);

/* Where the installed headers put each field of struct rte_mbuf, for the test of the flat
 * definition in src/mbuf.rs. */
#define MLX4RS_MBUF(field) { #field, offsetof(struct rte_mbuf, field) }
const struct mlx4rs_named_bit mlx4rs_mbuf_offsets[] = {
	MLX4RS_MBUF(buf_addr), MLX4RS_MBUF(buf_iova), MLX4RS_MBUF(data_off),
	MLX4RS_MBUF(refcnt), MLX4RS_MBUF(nb_segs), MLX4RS_MBUF(port), MLX4RS_MBUF(ol_flags),
	MLX4RS_MBUF(packet_type), MLX4RS_MBUF(pkt_len), MLX4RS_MBUF(data_len),
	MLX4RS_MBUF(vlan_tci), MLX4RS_MBUF(hash), MLX4RS_MBUF(vlan_tci_outer),
	MLX4RS_MBUF(buf_len), MLX4RS_MBUF(pool), MLX4RS_MBUF(next), MLX4RS_MBUF(tx_offload),
	MLX4RS_MBUF(shinfo), MLX4RS_MBUF(priv_size), MLX4RS_MBUF(timesync),
	MLX4RS_MBUF(dynfield1),
	{ "sizeof", sizeof(struct rte_mbuf) },
};
const unsigned mlx4rs_mbuf_offsets_n = sizeof(mlx4rs_mbuf_offsets) / sizeof(mlx4rs_mbuf_offsets[0]);
