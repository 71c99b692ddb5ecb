#!/usr/bin/env bash
# `cargo check` of the driver against a DPDK release that no machine here can run (23.11, which
# Ubuntu 24.04 ships and Debian does not), from the headers of its git tag:
#   bash scripts/check-release.sh DPDK_GIT_DIR v23.11.7
# DPDK_GIT_DIR is a clone of DPDK's public repository with its release tags (see
# doc/dpdk-releases.md). The headers are laid out as the packages install them, with this
# machine's rte_build_config.h; nothing of DPDK is built.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/dpdk-headers.sh"
git=${1:?usage: check-release.sh DPDK_GIT_DIR TAG}
tag=${2:?usage: check-release.sh DPDK_GIT_DIR TAG}
cache=${MLX4RS_CACHE:-/var/cache/mlx4rs}
stage="$cache/headers-$tag"
[ -f "$stage/rte_ethdev.h" ] || stage_headers "$git" "$tag" "$stage" /
cd "$top"
MLX4RS_DPDK_INCLUDE="$stage" MLX4RS_DPDK_VERSION="${tag#v}" \
  cargo check --workspace --all-targets --target-dir "$top/target/check-${tag#v}"
echo "check-release: the workspace checks against DPDK ${tag#v}"
