//! The port's receive side as the control channel sets it: steering and RSS, the MAC, VLAN
//! and multicast filters, flow control, the MTU, and flow rules with their RSS contexts.

use super::*;

impl DevState {
    /// Receive queues the flow hash spreads frames over, in indirection-table order; empty =
    /// every RQ in QPN order.
    pub(crate) fn set_steering(&mut self, qpns: &[u32]) -> Result<(), HcaError> {
        if let Some(&bad) = qpns.iter().find(|&&q| !self.rqs.contains(&q)) {
            return Err(HcaError::NotFound("RQ", bad));
        }
        self.rx.steering = qpns.to_vec();
        Ok(())
    }

    pub(crate) fn set_rss(&mut self, key: [u8; RSS_KEY_LEN], fields: RssFields) {
        self.rx.rss_key = key;
        self.rx.toeplitz = Toeplitz::new(&key);
        self.rx.rss_fields = fields;
        self.rx.memo.forget();
    }

    pub(crate) fn rss(&self) -> ([u8; RSS_KEY_LEN], RssFields) {
        (self.rx.rss_key, self.rx.rss_fields)
    }

    /// The port's MAC as the only unicast address, and the two switches.
    pub(crate) fn set_rx_filter(&mut self, mac: [u8; 6], promisc: bool, allmulti: bool) {
        let f = &mut self.rx.filter;
        f.unicast = vec![mac];
        f.promisc = promisc;
        f.allmulti = allmulti;
    }

    pub(crate) fn set_mac_table(&mut self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        if macs.len() > MAX_MAC_ADDRS {
            return Err(HcaError::NoResources("MAC table entries"));
        }
        if let Some(m) = macs.iter().find(|m| m[0] & 1 != 0) {
            return Err(HcaError::InvalidArgument(format!(
                "{m:02x?} is a multicast address, not one for the unicast table"
            )));
        }
        self.rx.filter.unicast = dedup(macs);
        Ok(())
    }

    pub(crate) fn set_mc_list(&mut self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        if macs.len() > MAX_MC_ADDRS {
            return Err(HcaError::NoResources("multicast list entries"));
        }
        if let Some(m) = macs.iter().find(|m| m[0] & 1 == 0) {
            return Err(HcaError::InvalidArgument(format!(
                "{m:02x?} is a unicast address, not one for the multicast list"
            )));
        }
        self.rx.filter.multicast = dedup(macs);
        Ok(())
    }

    pub(crate) fn set_promisc(&mut self, on: bool) {
        self.rx.filter.promisc = on;
    }

    pub(crate) fn set_allmulti(&mut self, on: bool) {
        self.rx.filter.allmulti = on;
    }

    pub(crate) fn set_vlan_filtering(&mut self, on: bool) {
        self.rx.filter.vlan_filter = on;
    }

    pub(crate) fn set_vlan(&mut self, vid: u16, member: bool) -> Result<(), HcaError> {
        if vid >= 4096 {
            return Err(HcaError::InvalidArgument(format!(
                "VLAN ID {vid} is not below 4096"
            )));
        }
        self.rx.filter.set_vlan(vid, member);
        Ok(())
    }

    pub(crate) fn rx_filter(&self) -> RxFilter {
        self.rx.filter.snapshot()
    }

    pub(crate) fn set_flows_only(&mut self, on: bool) {
        self.rx.flows_only = on;
    }

    pub(crate) fn set_flow_control(&mut self, fc: FlowControl) -> Result<(), HcaError> {
        if fc.low_water > fc.high_water {
            return Err(HcaError::InvalidArgument(format!(
                "flow control low water {} above high water {}",
                fc.low_water, fc.high_water
            )));
        }
        self.flow_control = fc;
        Ok(())
    }

    pub(crate) fn flow_control(&self) -> FlowControl {
        self.flow_control
    }

    /// The port's MTU; a TAP interface takes it too.
    pub(crate) fn set_mtu(&mut self, mtu: u16) -> std::io::Result<()> {
        self.rx.mtu = mtu;
        self.wire.set_mtu(mtu)
    }

    pub(crate) fn mtu(&self) -> u16 {
        self.rx.mtu
    }

    fn check_rq(&self, qpn: u32) -> Result<(), HcaError> {
        match self.qps.get(qp_slot(qpn)) {
            Some(Qp::Rq(rq)) if rq.qpn == qpn => Ok(()),
            _ => Err(HcaError::NotFound("RQ", qpn)),
        }
    }

    pub(crate) fn create_rss_context(&mut self, ctx: RssContext) -> Result<u32, HcaError> {
        if ctx.rqs.is_empty() {
            return Err(HcaError::InvalidArgument(
                "an RSS context without RQs".into(),
            ));
        }
        for &q in &ctx.rqs {
            self.check_rq(q)?;
        }
        self.flows.create_ctx(ctx)
    }

    pub(crate) fn destroy_rss_context(&mut self, id: u32) -> Result<(), HcaError> {
        self.flows.destroy_ctx(id)
    }

    pub(crate) fn rss_context(&self, id: u32) -> Option<RssContext> {
        self.flows.rss_context(id)
    }

    pub(crate) fn create_flow(&mut self, rule: &FlowRule) -> Result<u32, HcaError> {
        if let FlowAction::Queue(q) = rule.action {
            self.check_rq(q)?;
        }
        self.flows.create(*rule)
    }

    pub(crate) fn destroy_flow(&mut self, id: u32) -> Result<(), HcaError> {
        self.flows.destroy(id)
    }

    pub(crate) fn flow_counters(&self, id: u32) -> Result<FlowCounters, HcaError> {
        self.flows
            .counters(id)
            .ok_or(HcaError::NotFound("flow rule", id))
    }

    pub(crate) fn flows(&self) -> Vec<(u32, FlowRule)> {
        self.flows.list()
    }
}

/// `macs` without repeats, in their first order.
fn dedup(macs: &[[u8; 6]]) -> Vec<[u8; 6]> {
    let mut v: Vec<[u8; 6]> = Vec::with_capacity(macs.len());
    for m in macs {
        if !v.contains(m) {
            v.push(*m);
        }
    }
    v
}
