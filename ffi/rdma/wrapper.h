/* rdma-core's verbs and mlx4 direct-verbs interfaces, as installed by libibverbs-dev. */
#include <infiniband/verbs.h>
#include <infiniband/mlx4dv.h>
