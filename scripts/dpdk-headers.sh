# Sourced: stage_headers GIT TAG DEST [CONFIG_ROOT]
# Lays one DPDK release's headers out as its packages install them (one flat directory, with
# generic/), from a tag of DPDK's public git repository. rte_build_config.h is made by DPDK's
# build, so it comes from an installed release under CONFIG_ROOT (default /), with the version
# macros set to the tag's. For generating bindings and for `cargo check` only: nothing is built.
stage_headers() {
  local git=$1 tag=$2 dest=$3 croot=${4:-/}
  local src="$dest.src" ver y m n cfg
  rm -rf "$dest" "$src"
  mkdir -p "$dest/generic" "$src"
  git --git-dir="$git" archive "$tag" lib drivers/bus/pci drivers/bus/vdev config | tar -x -C "$src"
  # Every library's headers; the per-OS and per-architecture ones come after, for Linux on
  # x86, over the generic ones of the same name.
  find "$src/lib" -name '*.h' \
    -not -path '*/eal/arm/*' -not -path '*/eal/ppc/*' -not -path '*/eal/loongarch/*' \
    -not -path '*/eal/riscv/*' -not -path '*/eal/x86/*' -not -path '*/eal/windows/*' \
    -not -path '*/eal/freebsd/*' -not -path '*/eal/linux/*' -not -path '*/include/generic/*' \
    -exec cp -t "$dest" {} +
  cp "$src"/lib/eal/include/generic/*.h "$dest/generic/"
  cp "$src"/lib/eal/x86/include/*.h "$src"/lib/eal/linux/include/*.h "$dest/"
  cp "$src"/drivers/bus/pci/*.h "$src"/drivers/bus/vdev/*.h "$src/config/rte_config.h" "$dest/"
  cfg=$(find "$croot/usr/include" -name rte_build_config.h -path '*dpdk*' | head -n 1)
  [ -n "$cfg" ] || { echo "stage_headers: no rte_build_config.h under $croot/usr/include" >&2; return 1; }
  ver=${tag#v}; y=${ver%%.*}; m=${ver#*.}; m=${m%%.*}; n=${ver#"$y.$m"}; n=${n#.}; n=${n:-0}
  sed -e "s/^#define RTE_VER_YEAR .*/#define RTE_VER_YEAR $y/" \
      -e "s/^#define RTE_VER_MONTH .*/#define RTE_VER_MONTH $((10#$m))/" \
      -e "s/^#define RTE_VER_MINOR .*/#define RTE_VER_MINOR $n/" "$cfg" >"$dest/rte_build_config.h"
  # 23.11 renamed RTE_IOVA_AS_PA, which a 22.11 configuration still sets, to RTE_IOVA_IN_MBUF.
  if ! grep -q RTE_IOVA_IN_MBUF "$dest/rte_build_config.h"; then
    echo '#define RTE_IOVA_IN_MBUF 1' >>"$dest/rte_build_config.h"
  fi
  rm -rf "$src"
}
