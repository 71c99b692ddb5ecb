//! DPDK's PMD info string: what `dpdk-pmdinfo.py` reads from a driver library to list its name,
//! the kernel modules it needs, the PCI IDs it claims and its devargs. DPDK's build generates
//! it from the registration macros (`buildtools/pmdinfogen.py`); cargo builds this library, so
//! it is written here in the same form: a NUL-terminated `PMD_INFO_STRING= {json}` in
//! `.rodata`. Tests hold it against the devargs table and the PCI ID table it restates.

/// The string, with a NUL in front: Rust packs other constant text into `.rodata` without
/// terminators, and the tool only takes a printable run that starts with the prefix.
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static mlx4rs_pmd_info: [u8; INFO.len() + 2] = {
    let mut b = [0u8; INFO.len() + 2];
    let s = INFO.as_bytes();
    let mut i = 0;
    while i < s.len() {
        b[i + 1] = s[i];
        i += 1;
    }
    b
};

const INFO: &str = concat!(
    "PMD_INFO_STRING= {",
    "\"name\": \"net_mlx4rs\", ",
    "\"params\": \"wire=null|loop|peer:<vdev>|pcap:<path>|tap:<ifname> wc=on|off ",
    "bf=auto|on|off txq_inline=<0|17-928> mac=<xx:xx:xx:xx:xx:xx> busy_poll=0|1 pro=0|1 ",
    "device_loop=lcore|port|process ",
    "faults=<tx_error:N/rx_error:N/db_drop:N/flap:N+M/cqe_drop:N/cqe_dup:N> tx_db_avoid=0|1 doorbell_ns=<0-100000>\", ",
    "\"kmod\": \"* ib_uverbs & mlx4_en & mlx4_core & mlx4_ib\", ",
    "\"pci_ids\": [[5555, 4099, 65535, 65535], [5555, 4103, 65535, 65535], ",
    "[5555, 4100, 65535, 65535]]}"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_restates_the_devargs_and_the_pci_ids() {
        assert_eq!(mlx4rs_pmd_info[0], 0);
        assert_eq!(*mlx4rs_pmd_info.last().unwrap(), 0);
        let body = INFO.strip_prefix("PMD_INFO_STRING= ").unwrap();
        assert!(body.bytes().all(|b| (0x20..0x7f).contains(&b)), "printable");
        let params = body
            .split("\"params\": \"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap();
        let keys: Vec<&str> = params
            .split(' ')
            .map(|w| w.split('=').next().unwrap())
            .collect();
        let known: Vec<&str> = crate::devargs::KEYS.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, known, "every devarg, in the table's order");
        let ids: Vec<String> = super::super::pci::PCI_IDS
            .iter()
            .map(|(v, d)| format!("[{v}, {d}, 65535, 65535]"))
            .collect();
        assert!(
            body.contains(&format!("\"pci_ids\": [{}]", ids.join(", "))),
            "{body}"
        );
        assert!(body.contains("\"name\": \"net_mlx4rs\""));
        assert_eq!(super::super::DRIVER_NAME.to_str().unwrap(), "net_mlx4rs");
    }
}
