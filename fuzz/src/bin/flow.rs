//! Flow specs as the device takes them: rules decoded from the input (any priority, pattern
//! and masks; drop, or a queue or RSS context that may not exist) are created and destroyed in
//! the order the input says. The device's rule table must agree with what it answered: every
//! rule it took is listed, with a unique id, until destroyed; a destroyed or unknown id is
//! refused; at most MAX_FLOWS live; none at the end.
use std::collections::BTreeMap;

use mlx4_hca::{
    EthMatch, FlowAction, FlowPattern, FlowRule, Hca, HcaConfig, Ipv4Match, L4Match, L4Proto,
    Masked, VlanMatch, MAX_FLOWS,
};

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0; N];
        for b in &mut a {
            *b = self.u8()?;
        }
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.arr()?))
    }
}

fn rule(b: &mut Bytes) -> Option<FlowRule> {
    let has = b.u8()?;
    let eth = (has & 1 != 0).then_some(()).map(|()| {
        Some(EthMatch {
            dst: Masked {
                value: b.arr()?,
                mask: b.arr()?,
            },
            src: Masked {
                value: b.arr()?,
                mask: b.arr()?,
            },
            ether_type: Masked {
                value: b.u16()?,
                mask: b.u16()?,
            },
        })
    });
    let vlan = (has & 2 != 0).then_some(()).map(|()| {
        Some(VlanMatch {
            vid: Masked {
                value: b.u16()?,
                mask: b.u16()?,
            },
        })
    });
    let ipv4 = (has & 4 != 0).then_some(()).map(|()| {
        Some(Ipv4Match {
            src: Masked {
                value: b.arr()?,
                mask: b.arr()?,
            },
            dst: Masked {
                value: b.arr()?,
                mask: b.arr()?,
            },
        })
    });
    let l4 = (has & 8 != 0).then_some(()).map(|()| {
        Some(L4Match {
            proto: if has & 16 != 0 {
                L4Proto::Tcp
            } else {
                L4Proto::Udp
            },
            src_port: Masked {
                value: b.u16()?,
                mask: b.u16()?,
            },
            dst_port: Masked {
                value: b.u16()?,
                mask: b.u16()?,
            },
        })
    });
    let priority = b.u16()?;
    let action = match b.u8()? % 3 {
        0 => FlowAction::Drop,
        1 => FlowAction::Queue(u32::from(b.u16()?)),
        _ => FlowAction::Rss(u32::from(b.u8()?)),
    };
    Some(FlowRule {
        priority,
        pattern: FlowPattern {
            eth: eth.flatten(),
            vlan: vlan.flatten(),
            ipv4: ipv4.flatten(),
            l4: l4.flatten(),
        },
        action,
    })
}

fn main() {
    // One model for the whole run (opening one per input would cost more than the input);
    // a panic ends the process, so nothing sees it half-way.
    let hca = std::panic::AssertUnwindSafe(
        Hca::open(HcaConfig {
            threaded: false,
            ..HcaConfig::default()
        })
        .expect("model"),
    );
    afl::fuzz!(|data: &[u8]| {
        let mut b = Bytes(data);
        let mut live: BTreeMap<u32, FlowRule> = BTreeMap::new();
        let mut gone = Vec::new();
        while let Some(op) = b.u8() {
            if op & 0x80 == 0 {
                let Some(r) = rule(&mut b) else { break };
                if let Ok(id) = hca.create_flow(&r) {
                    assert!(live.insert(id, r).is_none(), "id {id} handed out twice");
                    assert!(live.len() <= MAX_FLOWS);
                }
            } else if let Some(&id) = live.keys().nth(usize::from(op & 0x7f) % live.len().max(1)) {
                hca.destroy_flow(id).expect("destroying a live rule");
                live.remove(&id);
                gone.push(id);
            }
            let listed: Vec<u32> = hca.flows().into_iter().map(|(id, _)| id).collect();
            let mut expect: Vec<u32> = live.keys().copied().collect();
            let mut got = listed.clone();
            got.sort_unstable();
            expect.sort_unstable();
            assert_eq!(got, expect, "the device lists what it took");
        }
        for id in gone.iter().filter(|id| !live.contains_key(id)) {
            assert!(
                hca.destroy_flow(*id).is_err(),
                "destroyed id {id} destroyed again"
            );
        }
        for id in live.keys() {
            hca.destroy_flow(*id).expect("destroying a live rule");
        }
        assert!(hca.flows().is_empty(), "rules left after destroying all");
    });
}
