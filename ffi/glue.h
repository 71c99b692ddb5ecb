/* C entry points for the static inline functions and thread-locals of DPDK that the
 * control path needs. Nothing here is meant to be called per packet. */
#ifndef MLX4RS_GLUE_H
#define MLX4RS_GLUE_H
#include <stdint.h>
struct rte_mempool;
struct rte_mbuf;

unsigned mlx4rs_lcore_id(void);
int mlx4rs_errno(void);
void mlx4rs_set_errno(int e);
struct rte_mbuf *mlx4rs_pktmbuf_alloc(struct rte_mempool *mp);
int mlx4rs_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
int mlx4rs_mbuf_raw_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
void mlx4rs_mempool_put_bulk(struct rte_mempool *mp, void *const *objs, unsigned n);
void mlx4rs_log(uint32_t level, uint32_t logtype, const char *msg);
uint16_t mlx4rs_pktmbuf_data_room_size(struct rte_mempool *mp);

/* A header constant by name, for tests of the values restated in Rust. */
struct mlx4rs_named_bit {
	const char *name;
	uint64_t value;
};
extern const struct mlx4rs_named_bit mlx4rs_header_bits[];
extern const unsigned mlx4rs_header_bits_n;
extern const struct mlx4rs_named_bit mlx4rs_mbuf_offsets[];
extern const unsigned mlx4rs_mbuf_offsets_n;
#endif
