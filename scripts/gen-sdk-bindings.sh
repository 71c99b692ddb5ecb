#!/usr/bin/env bash
# Regenerates the committed driver-SDK bindings of one DPDK release from its git tag:
#   scripts/gen-sdk-bindings.sh DPDK_GIT_DIR TAG [CONFIG_ROOT]
# e.g. scripts/gen-sdk-bindings.sh ~/dpdk/.git v24.11.6 /var/cache/mlx4rs/root-trixie
# DPDK_GIT_DIR is a clone of DPDK's public repository with its release tags (see
# doc/dpdk-releases.md); CONFIG_ROOT is a root filesystem with that release's libdpdk-dev
# installed (scripts/release-root.sh), for its rte_build_config.h. Writes ffi/sdk/vYY_MM.rs.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/dpdk-headers.sh"
git=${1:?usage: gen-sdk-bindings.sh DPDK_GIT_DIR TAG [CONFIG_ROOT]}
tag=${2:?usage: gen-sdk-bindings.sh DPDK_GIT_DIR TAG [CONFIG_ROOT]}
croot=${3:-/}
ver=${tag#v}; y=${ver%%.*}; m=${ver#*.}; m=${m%%.*}
stage=$(mktemp -d)/include
trap 'rm -rf "$(dirname "$stage")"' EXIT
stage_headers "$git" "$tag" "$stage" "$croot"
cd "$top"
cargo run -q --release -p dpdk-sdkgen -- --include "$stage" --tag "$tag" --out "ffi/sdk/v${y}_${m}.rs"
rustfmt --edition 2021 "ffi/sdk/v${y}_${m}.rs"
