#!/usr/bin/env bash
# Presents a ConnectX-3 backed by the software HCA to DPDK's own C mlx4 driver (Debian's
# librte_net_mlx4.so), through the verbs stand-in built from pmd/verbs:
#
#   DIR/sys   a sysfs tree of its own: the PCI function EAL scans (SYSFS_PCI_DEVICES), with
#             vendor/device/class/resource/uevent, a driver link to mlx4_core and
#             net/NETDEV/dev_port, and the verbs device class/infiniband/mlx4_0 whose `device`
#             is that function (where the C driver reads its PCI address and its netdev);
#   DIR/lib   libibverbs.so.1, libmlx4.so.1, libmlx5.so.1 and libmana.so.1, all the stand-in
#             (from 24.11 EAL also loads the MANA driver, which links libmana).
#
# Prints the environment to use (eval it), then run testpmd with `-a PCI`:
#
#   eval "$(scripts/c-mlx4-env.sh /tmp/c4 target/release/libmlx4_verbs.so)"
#   export MLX4RS_VERBS="ibdev=$MLX4RS_IBDEV,wire=pcap:/tmp/c4/out.pcap,stats=/tmp/c4/stats"
#   dpdk-testpmd -l 0-1 --no-huge -m 512 -a "$MLX4RS_PCI" -- -i --total-num-mbufs=8192
#
# Usage: scripts/c-mlx4-env.sh DIR STAND_IN_SO [PCI_ADDR [DEVICE_ID [NETDEV]]]
#   PCI_ADDR   default 0000:00:05.0
#   DEVICE_ID  0x1003 ConnectX-3 (default), 0x1007 ConnectX-3 Pro, 0x1004 ConnectX-3 VF
#   NETDEV     the port's kernel netdev; the stand-in creates it as a TAP when it does not exist
#              (default m4c<5 digits of the PID>)
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d' >&2
  exit 2
fi
dir=$(realpath -m "$1")
lib=$(realpath "$2")
pci=${3:-0000:00:05.0}
part=${4:-0x1003}
netdev=${5:-m4c$(($$ % 100000))}
[ -f "$lib" ] || { echo "c-mlx4-env: $lib not found (cargo build -p mlx4-verbs)" >&2; exit 1; }
[ ${#netdev} -lt 16 ] || { echo "c-mlx4-env: netdev name $netdev longer than 15" >&2; exit 1; }

sys="$dir/sys"
func="$sys/devices/pci0000:00/$pci"
rm -rf "$sys" "$dir/lib"
mkdir -p "$func/net/$netdev" "$func/infiniband/mlx4_0" "$sys/bus/pci/devices" \
  "$sys/bus/pci/drivers/mlx4_core" "$sys/class/infiniband" "$dir/lib"
echo 0x15b3 > "$func/vendor"
printf '0x%04x\n' "$part" > "$func/device"
echo 0x15b3 > "$func/subsystem_vendor"
echo 0x0006 > "$func/subsystem_device"
echo 0x020000 > "$func/class"
echo -1 > "$func/numa_node"
echo 0 > "$func/max_vfs"
for _ in 1 2 3 4 5 6; do
  echo "0x0000000000000000 0x0000000000000000 0x0000000000000000"
done > "$func/resource"
printf 'DRIVER=mlx4_core\nPCI_CLASS=20000\nPCI_ID=15B3:%04X\nPCI_SUBSYS_ID=15B3:0006\nPCI_SLOT_NAME=%s\n' \
  "$part" "$pci" > "$func/uevent"
echo 0 > "$func/net/$netdev/dev_port"
ln -s "$sys/bus/pci/drivers/mlx4_core" "$func/driver"
ln -s "$func" "$func/infiniband/mlx4_0/device"
ln -s "$func" "$sys/bus/pci/devices/$pci"
ln -s "$func/infiniband/mlx4_0" "$sys/class/infiniband/mlx4_0"
for name in libibverbs.so.1 libmlx4.so.1 libmlx5.so.1 libmana.so.1; do
  ln -s "$lib" "$dir/lib/$name"
done

echo "export SYSFS_PCI_DEVICES='$sys/bus/pci/devices'"
echo "export LD_LIBRARY_PATH='$dir/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export MLX4RS_IBDEV='$sys/class/infiniband/mlx4_0'"
echo "export MLX4RS_PCI='$pci'"
echo "export MLX4RS_NETDEV='$netdev'"
