#!/usr/bin/env python3
"""Prints the driver directory that the installed EAL loads by itself.

pkg-config does not publish it, but EAL embeds it as "DPDK_PLUGIN_PATH=<dir>" (for the
pmdinfo tooling), which is the value EAL itself uses. If a build lacks that string, fall back
to DPDK's own layout rule: <libdir>/dpdk/pmds-<ABI>, ABI taken from the library's file name.
"""
import glob
import os
import re
import sys


def main(libdir):
    candidates = sorted(glob.glob(os.path.join(libdir, "librte_eal.so*")))
    if not candidates:
        sys.exit(f"find_pmd_dir: no librte_eal.so* in {libdir}: is DPDK (shared) installed?")
    # The unversioned name is a link to the runtime library; realpath names its ABI.
    eal = os.path.realpath(candidates[0])
    with open(eal, "rb") as f:
        m = re.search(rb"DPDK_PLUGIN_PATH=([^\0]+)\0", f.read())
    if m and m.group(1).startswith(b"/"):
        print(m.group(1).decode())
        return
    m = re.search(r"\.so\.(\d+(?:\.\d+)?)$", eal)
    if not m:
        sys.exit(f"find_pmd_dir: cannot tell the DPDK ABI from {eal}; set -Dpmd_dir=")
    abi = m.group(1) if "." in m.group(1) else m.group(1) + ".0"
    print(os.path.join(libdir, "dpdk", "pmds-" + abi))


if __name__ == "__main__":
    main(sys.argv[1])
