//! The devargs parser's tests: every key's accepted and refused values, and the messages.

use super::*;

fn parse(s: &str) -> Result<Devargs, DevargsError> {
    s.parse()
}

#[test]
fn empty_gives_defaults() {
    let d = parse("").unwrap();
    assert_eq!(d, Devargs::default());
    assert_eq!(d.txq_inline, 104);
    assert_eq!(d.bf, BfMode::Auto);
    assert_eq!(d.wc, WcMode::On);
    assert_eq!(d.wire.as_str(), "null");
    assert_eq!(d.device_loop, DeviceLoop::Lcore);
}

#[test]
fn device_loops() {
    for l in [
        DeviceLoop::Lcore,
        DeviceLoop::PortThread,
        DeviceLoop::ProcessThread,
    ] {
        let d = parse(&format!("device_loop={}", l.as_str())).unwrap();
        assert_eq!(d.device_loop, l);
    }
    for v in ["", "thread", "Lcore", "1"] {
        let e = parse(&format!("device_loop={v}")).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("device_loop", v));
        assert_eq!(e.allowed, allowed("device_loop"));
    }
}

#[test]
fn all_keys() {
    let d = parse(
        "wire=pcap:/tmp/x.pcap,wc=off,bf=on,txq_inline=0,mac=02:00:00:aa:bb:0c,busy_poll=1,device_loop=process,",
    )
    .unwrap();
    assert_eq!(d.device_loop, DeviceLoop::ProcessThread);
    assert_eq!(d.wire.as_str(), "pcap:/tmp/x.pcap");
    assert_eq!(d.wc, WcMode::Off);
    assert_eq!(d.bf, BfMode::On);
    assert_eq!(d.txq_inline, 0);
    assert_eq!(d.mac, Some([2, 0, 0, 0xaa, 0xbb, 0x0c]));
    assert!(d.busy_poll);
    assert!(!d.tx_db_avoid);
    assert!(parse("tx_db_avoid=1").unwrap().tx_db_avoid);
    assert!(parse("tx_db_avoid=2").is_err());
}

#[test]
fn doorbell_ns() {
    assert_eq!(Devargs::default().doorbell_ns, 0);
    assert_eq!(parse("doorbell_ns=177").unwrap().doorbell_ns, 177);
    assert_eq!(parse("doorbell_ns=100000").unwrap().doorbell_ns, 100_000);
    for v in ["100001", "-1", "+5", "", "1e3", "0x10", "4294967296"] {
        let e = parse(&format!("doorbell_ns={v}")).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.allowed.as_str()),
            ("doorbell_ns", allowed("doorbell_ns"))
        );
    }
}

#[test]
fn faults() {
    let d = parse("faults=tx_error:100/rx_error:7/db_drop:64/flap:5000+100").unwrap();
    assert_eq!(d.faults.tx_error_every, 100);
    assert_eq!(d.faults.rx_error_every, 7);
    assert_eq!(d.faults.doorbell_drop_every, 64);
    assert_eq!(
        (d.faults.link_flap_every, d.faults.link_flap_frames),
        (5000, 100)
    );
    assert!(parse("").unwrap().faults.none());
    for v in [
        "",
        "tx_error",
        "tx_error:+1",
        "tx_error:1/tx_error:2",
        "flap:5",
        "rx_error:1/",
        "smoke:1",
    ] {
        let e = parse(&format!("faults={v}")).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("faults", v));
        assert!(e.allowed.contains("tx_error:N"), "{e}");
    }
    let e = parse("faults=tx_error:x").unwrap_err().to_string();
    assert!(e.contains("\"x\" is not a count"), "{e}");
}

#[test]
fn wires() {
    for w in [
        "null",
        "loop",
        "peer:net_mlx4rs1",
        "pcap:/a/b.pcap",
        "tap:mlx4rs0",
    ] {
        assert_eq!(parse(&format!("wire={w}")).unwrap().wire.as_str(), w);
    }
    for w in ["", "nul", "peer:", "pcap:", "tap:", "ether"] {
        let e = parse(&format!("wire={w}")).unwrap_err();
        assert_eq!(e.key, "wire");
        assert_eq!(e.value, w);
    }
}

#[test]
fn unknown_key_names_the_key_and_lists_known_ones() {
    let e = parse("wire=loop,colour=blue").unwrap_err();
    assert_eq!(e.key, "colour");
    assert_eq!(e.value, "blue");
    let msg = e.to_string();
    assert!(msg.contains("colour=\"blue\""), "{msg}");
    assert!(msg.contains("txq_inline"), "{msg}");
}

#[test]
fn key_without_value() {
    let e = parse("bf").unwrap_err();
    assert_eq!(e.key, "bf");
    assert!(e.allowed.contains("key=value"));
}

#[test]
fn duplicate_key() {
    let e = parse("bf=on,bf=off").unwrap_err();
    assert_eq!((e.key.as_str(), e.value.as_str()), ("bf", "off"));
    assert!(e.allowed.contains("twice"));
}

#[test]
fn bad_enums() {
    for (k, v) in [
        ("wc", "maybe"),
        ("wc", "ON"),
        ("bf", "yes"),
        ("bf", ""),
        ("busy_poll", "2"),
    ] {
        let e = parse(&format!("{k}={v}")).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), (k, v));
        assert_eq!(e.allowed, allowed(k));
    }
}

#[test]
fn inline_bounds() {
    assert_eq!(parse("txq_inline=17").unwrap().txq_inline, 17);
    assert_eq!(parse("txq_inline=928").unwrap().txq_inline, 928);
    for v in [
        "1", "16", "929", "65536", "-1", "abc", "1e2", "+17", "0x20", "",
    ] {
        let e = parse(&format!("txq_inline={v}")).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("txq_inline", v));
    }
}

#[test]
fn macs() {
    assert_eq!(parse_mac("02:00:00:00:00:01"), Some([2, 0, 0, 0, 0, 1]));
    assert_eq!(
        parse_mac("0A:1b:2C:3d:4E:5f"),
        Some([0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f])
    );
    for m in [
        "",
        "02:00:00:00:00",
        "02:00:00:00:00:01:02",
        "01:00:5e:00:00:01",
        "ff:ff:ff:ff:ff:ff",
        "00:00:00:00:00:00",
        "2:0:0:0:0:1",
        "02:00:00:00:00:+1",
        "+2:00:00:00:00:01",
        "02:00:00:00:00:-1",
        " 2:00:00:00:00:01",
        "02-00-00-00-00-01",
        "zz:00:00:00:00:01",
    ] {
        assert_eq!(parse_mac(m), None, "{m}");
        assert_eq!(parse(&format!("mac={m}")).unwrap_err().key, "mac");
    }
}

#[test]
fn nothing_is_trimmed() {
    // DPDK's kvargs keeps whitespace; so do we, and refuse it.
    let e = parse("bf =on").unwrap_err();
    assert_eq!(e.key, "bf ");
    assert!(e.allowed.starts_with("unknown key"), "{e}");
    assert_eq!(parse(" bf=on").unwrap_err().key, " bf");
    for (item, key) in [
        ("wire=null\u{a0}", "wire"),
        ("bf=on ", "bf"),
        ("wc=\toff", "wc"),
        ("busy_poll=1\n", "busy_poll"),
        ("mac=02:00:00:00:00:01\u{2003}", "mac"),
    ] {
        let e = parse(item).unwrap_err();
        assert_eq!(e.key, key, "{item:?}");
        assert!(e.allowed.contains("whitespace"), "{e}");
    }
}

#[test]
fn messages_escape_control_characters() {
    let e = parse("wire=tap:a\x1b[2Jb").unwrap_err();
    let msg = e.to_string();
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    assert!(msg.contains("\\u{1b}"), "{msg}");
    let e = parse("colour\x07=x").unwrap_err();
    assert!(!e.to_string().chars().any(char::is_control));
}

fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mlx4rs-devargs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn targets(wire: &str) -> Result<(), DevargsError> {
    parse(&format!("wire={wire}"))?.check_targets()
}

#[test]
fn pcap_targets_are_checked_and_created_at_probe() {
    let dir = scratch_dir("pcap");
    let file = dir.join("out.pcap");
    targets(&format!("pcap:{}", file.display())).unwrap();
    assert!(file.is_file(), "created at probe");
    std::fs::write(&file, b"old").unwrap();
    targets(&format!("pcap:{}", file.display())).unwrap();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"old",
        "not truncated before start"
    );
    let long = format!("pcap:{}/{}", dir.display(), "x".repeat(4096));
    let missing = format!("pcap:{}/no/such/dir/x.pcap", dir.display());
    let a_dir = format!("pcap:{}", dir.display());
    for (bad, why) in [
        (missing.as_str(), "existing directory"),
        (a_dir.as_str(), "directory"),
        ("pcap:/proc", "directory"),
        ("pcap:/dev/full", "special file"),
        (long.as_str(), "cannot"),
    ] {
        let e = targets(bad).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("wire", bad));
        assert!(e.allowed.contains(why), "{bad}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tap_names_are_checked_at_probe() {
    targets("tap:mlx4rs-t0").unwrap();
    targets("tap:a.b_c-9").unwrap();
    for bad in [
        "tap:a/b",
        "tap:.",
        "tap:..",
        "tap:a:b",
        "tap:%s%s%n",
        "tap:abcdefghijklmnop",
        "tap:lo",
    ] {
        let e = targets(bad).unwrap_err();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("wire", bad));
    }
    assert!(targets("tap:lo").unwrap_err().allowed.contains("not a TAP"));
}

/// xorshift64*: a fixed seed gives the same strings on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

#[test]
fn fuzz_every_rejection_names_its_key() {
    let dir = scratch_dir("fuzz");
    let pcap = format!("pcap:{}/f.pcap", dir.display());
    let keys = [
        "wire",
        "wc",
        "bf",
        "txq_inline",
        "mac",
        "busy_poll",
        "faults",
        "colour",
        "",
        "bf ",
        "WIRE",
    ];
    let values = [
        "null",
        "loop",
        "peer:net_mlx4rs1",
        pcap.as_str(),
        "pcap:/proc",
        "tap:mlx4rs-f",
        "tap:lo",
        "tap:a/b",
        "on",
        "off",
        "auto",
        "0",
        "1",
        "17",
        "104",
        "928",
        "929",
        "+17",
        "-1",
        "02:00:00:00:00:01",
        "02:00:00:00:00:+1",
        "ff:ff:ff:ff:ff:ff",
        "",
        " on",
        "on\u{a0}",
        "\x1b",
        "=",
        "a=b",
        "\u{1F600}",
        "tx_error:5",
        "rx_error:3/db_drop:2",
        "flap:10+2",
        "flap:10",
        "tx_error:-5",
    ];
    let mut rng = Rng(0x6d6c_7834_7273);
    let (mut ok, mut rejected) = (0, 0);
    for _ in 0..2000 {
        let n = rng.next() % 5;
        let mut items = Vec::new();
        for _ in 0..n {
            let item = match rng.next() % 8 {
                0 => rng.pick(&keys).to_owned(),
                1 => String::new(),
                _ => format!("{}={}", rng.pick(&keys), rng.pick(&values)),
            };
            items.push(item);
        }
        let text = items.join(",");
        match parse(&text).and_then(|d| d.check_targets().map(|()| d)) {
            Ok(_) => ok += 1,
            Err(e) => {
                rejected += 1;
                // The key it names is one of the items, exactly as written.
                assert!(
                    items
                        .iter()
                        .any(|i| i == &e.key || i.starts_with(&format!("{}=", e.key))),
                    "{text:?} rejected naming {:?}",
                    e.key
                );
                let msg = e.to_string();
                assert!(!msg.chars().any(char::is_control), "{msg:?}");
                assert!(!e.allowed.is_empty());
            }
        }
    }
    assert!(
        ok > 100 && rejected > 100,
        "both outcomes exercised: {ok} ok, {rejected} rejected"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
