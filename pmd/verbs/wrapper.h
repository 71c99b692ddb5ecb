/* The rdma-core ABI the stand-in implements: verbs (libibverbs) and the mlx4 direct verbs. */
#include <infiniband/verbs.h>
#include <infiniband/mlx4dv.h>
