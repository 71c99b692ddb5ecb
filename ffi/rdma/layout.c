/*
 * The layout of the direct-verbs and context structs as the C compiler sees the installed
 * rdma-core headers. A unit test compares bindgen's Rust view against this table: the two must
 * agree or the stand-in would hand the C driver fields at the wrong offsets.
 */
#include <stddef.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx4dv.h>

struct mlx4rs_verbs_field {
	const char *name;
	size_t offset;
	size_t size;
};

#define SIZE(t) { #t, 0, sizeof(struct t) }
#define FIELD(t, f) { #t "." #f, offsetof(struct t, f), sizeof(((struct t *)0)->f) }

const struct mlx4rs_verbs_field mlx4rs_verbs_c_layout[] = {
	SIZE(mlx4dv_qp),
	FIELD(mlx4dv_qp, rdb),
	FIELD(mlx4dv_qp, sdb),
	FIELD(mlx4dv_qp, doorbell_qpn),
	FIELD(mlx4dv_qp, sq.wqe_cnt),
	FIELD(mlx4dv_qp, sq.wqe_shift),
	FIELD(mlx4dv_qp, sq.offset),
	FIELD(mlx4dv_qp, rq.wqe_cnt),
	FIELD(mlx4dv_qp, rq.wqe_shift),
	FIELD(mlx4dv_qp, rq.offset),
	FIELD(mlx4dv_qp, buf.buf),
	FIELD(mlx4dv_qp, buf.length),
	FIELD(mlx4dv_qp, comp_mask),
	FIELD(mlx4dv_qp, uar_mmap_offset),
	SIZE(mlx4dv_cq),
	FIELD(mlx4dv_cq, buf.buf),
	FIELD(mlx4dv_cq, buf.length),
	FIELD(mlx4dv_cq, cqe_cnt),
	FIELD(mlx4dv_cq, cqn),
	FIELD(mlx4dv_cq, set_ci_db),
	FIELD(mlx4dv_cq, arm_db),
	FIELD(mlx4dv_cq, arm_sn),
	FIELD(mlx4dv_cq, cqe_size),
	FIELD(mlx4dv_cq, comp_mask),
	FIELD(mlx4dv_cq, cq_uar),
	SIZE(mlx4dv_rwq),
	FIELD(mlx4dv_rwq, rdb),
	FIELD(mlx4dv_rwq, rq.wqe_cnt),
	FIELD(mlx4dv_rwq, rq.wqe_shift),
	FIELD(mlx4dv_rwq, rq.offset),
	FIELD(mlx4dv_rwq, buf.buf),
	FIELD(mlx4dv_rwq, buf.length),
	FIELD(mlx4dv_rwq, comp_mask),
	SIZE(mlx4dv_obj),
	FIELD(mlx4dv_obj, qp.in),
	FIELD(mlx4dv_obj, qp.out),
	FIELD(mlx4dv_obj, cq.in),
	FIELD(mlx4dv_obj, cq.out),
	FIELD(mlx4dv_obj, srq.in),
	FIELD(mlx4dv_obj, rwq.in),
	FIELD(mlx4dv_obj, rwq.out),
	SIZE(mlx4dv_ctx_allocators),
	FIELD(mlx4dv_ctx_allocators, alloc),
	FIELD(mlx4dv_ctx_allocators, free),
	FIELD(mlx4dv_ctx_allocators, data),
	SIZE(verbs_context),
	FIELD(verbs_context, query_port),
	FIELD(verbs_context, create_rwq_ind_table),
	FIELD(verbs_context, destroy_rwq_ind_table),
	FIELD(verbs_context, create_wq),
	FIELD(verbs_context, modify_wq),
	FIELD(verbs_context, destroy_wq),
	FIELD(verbs_context, query_device_ex),
	FIELD(verbs_context, ibv_create_flow),
	FIELD(verbs_context, ibv_destroy_flow),
	FIELD(verbs_context, create_qp_ex),
	FIELD(verbs_context, sz),
	FIELD(verbs_context, context),
	SIZE(ibv_context),
	FIELD(ibv_context, device),
	FIELD(ibv_context, ops),
	FIELD(ibv_context, cmd_fd),
	FIELD(ibv_context, async_fd),
	FIELD(ibv_context, num_comp_vectors),
	FIELD(ibv_context, abi_compat),
	SIZE(ibv_device),
	FIELD(ibv_device, name),
	FIELD(ibv_device, ibdev_path),
	SIZE(ibv_device_attr_ex),
	FIELD(ibv_device_attr_ex, tso_caps),
	FIELD(ibv_device_attr_ex, rss_caps),
	FIELD(ibv_device_attr_ex, raw_packet_caps),
	SIZE(ibv_qp_init_attr_ex),
	FIELD(ibv_qp_init_attr_ex, rwq_ind_tbl),
	FIELD(ibv_qp_init_attr_ex, rx_hash_conf),
	SIZE(ibv_flow_attr),
	SIZE(ibv_flow_spec_eth),
	{ NULL, 0, 0 },
};
