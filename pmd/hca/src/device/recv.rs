//! The receive delivery: frames from the port's receive buffer (or a cable's ring) offered to
//! the flow rules, the filters, steering and their RQ, in runs of frames that go to one RQ.

use super::*;
use crate::inbox::FrameRing;
use crate::rq::RqRun;

/// Received frames handled per poll, so TX doorbells are not starved by a receive flood.
const RX_BUDGET: usize = 64;

/// Where the port sends a frame: the RQ's slot and the frame's RSS hash.
#[derive(Debug, Clone, Copy)]
struct Route {
    rq: usize,
    hash: u32,
}

impl DevState {
    pub(super) fn poll_rx(&mut self) -> usize {
        let mut work = self.wire.poll_rx(&self.port, RX_BUDGET);
        if let Some(ring) = self.wire.cable().map(|c| c.rx.clone()) {
            if ring.pending() != 0 {
                work += self.deliver(&ring);
            }
            self.fold_wire_drops();
        }
        if self.port.has_pending() {
            let port = self.port.clone();
            work += self.deliver(&port.inbox);
        }
        self.flush_rx_cq();
        work
    }

    /// Write what the CQ that received last holds for its partner.
    fn flush_rx_cq(&mut self) {
        if let Some(cq) = self.rx_cq.take().and_then(|s| self.cqs.get_mut(s)) {
            cq.flush();
        }
    }

    /// Deliver up to a budget of `ring`'s frames; returns how many are done with. A frame is
    /// routed in full ([`DevState::route`]); the frames after it that the remembered headers
    /// recall (the same bytes up to the ports, the same length) are routed the same way by
    /// every rule but the flow rules, which count their hits per frame, so without flow rules
    /// they join its run: its RQ, CQ and region are found once, not once per frame. A frame
    /// whose CQ is full ends the delivery, to be offered again later.
    #[inline(always)]
    fn deliver(&mut self, ring: &FrameRing) -> usize {
        let mut recs = ring.records(RX_BUDGET);
        'frames: while let Some(first) = recs.peek() {
            let Some(to) = self.route(first) else {
                recs.take();
                continue;
            };
            let Some(Qp::Rq(rq)) = self.qps.get_mut(to.rq) else {
                // A steering entry whose RQ was destroyed: nowhere to put the frame.
                self.counters.rx_drops_no_wqe += 1;
                recs.take();
                continue;
            };
            let cq_at = cq_slot(rq.cqn);
            // The CQEs of consecutive frames pair up in their CQ's lines; a run that goes to
            // another CQ ends the pairing in the last one.
            if let Some(prev) = self.rx_cq.filter(|&s| s != cq_at) {
                if let Some(cq) = self.cqs.get_mut(prev) {
                    cq.flush();
                }
            }
            self.rx_cq = Some(cq_at);
            let Some(cq) = self.cqs.get_mut(cq_at) else {
                self.counters.rx_drops_no_wqe += 1;
                recs.take();
                continue;
            };
            let mut run = RqRun::new(rq, cq, &self.mrs, &mut self.faults.rx_error, first.len());
            let (heads, counters) = (self.rx.memo.heads(), &mut self.counters);
            // The routed frame is the run's first; the stretch may take it and those after
            // it, and the frame it stops at, if the run's, goes through the full receive.
            let mut routed = true;
            loop {
                let stretch = self.flows.is_empty() && self.rx_stretches;
                if stretch && run.stretch(&mut recs, &self.rx.memo, to.hash) != 0 {
                    routed = false;
                }
                let Some(frame) = recs.peek() else {
                    break;
                };
                let of_run = routed || (self.flows.is_empty() && self.rx.memo.recalls(frame));
                if !of_run {
                    break;
                }
                routed = false;
                if run.receive(frame, heads, to.hash, counters) == Rx::Wait {
                    run.end(heads.mac, counters);
                    break 'frames;
                }
                recs.take();
            }
            run.end(heads.mac, counters);
        }
        recs.finish()
    }

    /// Decide where the port sends `frame`: flow rules, else the filters and the default RSS;
    /// the MTU; then its RQ's slot. `None`: dropped and counted.
    #[inline(always)]
    fn route(&mut self, frame: &[u8]) -> Option<Route> {
        // The headers are parsed once (or remembered from the last frame of the flow); the RSS
        // hash and the RQ's classification read what was found.
        let rx = &mut self.rx;
        rx.memo.find(frame, &rx.toeplitz, rx.rss_fields);
        let (heads, port_hash) = (self.rx.memo.heads(), self.rx.memo.hash());
        let lay = heads.lay.as_ref();
        let verdict = if self.flows.is_empty() {
            None
        } else {
            self.flows.lookup(&net::frame_fields(frame), frame.len())
        };
        let (qpn, hash) = match verdict {
            Some(Verdict::Drop) => {
                self.counters.rx_drops_flow += 1;
                return None;
            }
            Some(v) => {
                if !self.rx.mtu_passes(heads.l3_len, &mut self.counters) {
                    return None;
                }
                match v {
                    Verdict::Queue(q) => (Some(q), port_hash),
                    Verdict::Rss(slot) => match self.flows.ctx(slot) {
                        Some(c) => {
                            let h = net::rss_hash_of(frame, lay, &c.toeplitz, c.ctx.fields);
                            let rqs = &c.ctx.rqs;
                            (rqs.get(h as usize % rqs.len().max(1)).copied(), h)
                        }
                        None => (None, 0),
                    },
                    Verdict::Drop => unreachable!("handled above"),
                }
            }
            None => {
                if !self.rx.filters_pass(frame, &mut self.counters)
                    || !self.rx.mtu_passes(heads.l3_len, &mut self.counters)
                {
                    return None;
                }
                (self.rx.steer(port_hash, &self.rqs), port_hash)
            }
        };
        let Some(qpn) = qpn else {
            self.counters.rx_drops_no_wqe += 1;
            return None;
        };
        Some(Route {
            rq: qp_slot(qpn),
            hash,
        })
    }
}
