//! The adapter's port: receive steering and RSS, MAC and VLAN filters, flow control, flow
//! rules, MTU, the wire and the link, port events and completion channels.

use std::sync::atomic::Ordering;

use crate::adapter::Hca;
use crate::error::{invalid, HcaError};
use crate::events::PortEvent;
use crate::flow::{FlowCounters, FlowRule, RssContext};
use crate::monitor;
use crate::rss::{RssFields, RSS_KEY_LEN};
use crate::rx::{FlowControl, RxFilter};
use crate::wire::{self, Wire};

impl Hca {
    /// Choose the receive queues frames are spread over by their RSS hash (the CQE carries the
    /// hash): the RSS indirection table, `rqs[hash % rqs.len()]`. Empty (the default) means
    /// every RQ in QPN order. A listed RQ destroyed later makes its share of frames drop.
    pub fn set_rx_steering(&self, rqs: &[u32]) -> Result<(), HcaError> {
        self.state().set_steering(rqs)
    }

    /// Set the Toeplitz RSS key (exactly [`RSS_KEY_LEN`] bytes) and the packet types hashed.
    /// The input is source then destination address, then source then destination port for
    /// TCP/UDP whose field set is on (addresses only when just the IP set is on); frames no
    /// enabled set covers hash to 0. Default: [`DEFAULT_RSS_KEY`](crate::DEFAULT_RSS_KEY) and
    /// [`RssFields::ALL`].
    pub fn set_rss(&self, key: &[u8], fields: RssFields) -> Result<(), HcaError> {
        let key: [u8; RSS_KEY_LEN] = key
            .try_into()
            .map_err(|_| invalid(format!("RSS key of {} bytes, not {RSS_KEY_LEN}", key.len())))?;
        self.state().set_rss(key, fields);
        Ok(())
    }

    /// The RSS key and hashed packet types in use.
    pub fn rss(&self) -> ([u8; RSS_KEY_LEN], RssFields) {
        self.state().rss()
    }

    /// Filter received frames by destination MAC: `mac` becomes the whole unicast table, and
    /// the promiscuous and all-multicast switches are set. `promisc` (the state of a new
    /// adapter) delivers everything; otherwise only frames to an address of the unicast table,
    /// broadcast, a multicast address of the multicast list or, with `allmulti`, any multicast
    /// address pass; the rest count as `rx_drops_filter`.
    pub fn set_rx_filter(&self, mac: [u8; 6], promisc: bool, allmulti: bool) {
        self.state().set_rx_filter(mac, promisc, allmulti);
    }

    /// Replace the unicast MAC table: up to [`MAX_MAC_ADDRS`](crate::MAX_MAC_ADDRS) (128, mlx4's
    /// limit) unicast addresses, repeats ignored; `NoResources` above that, `InvalidArgument` for
    /// a multicast address. An empty table passes no unicast frame (unless promiscuous).
    pub fn set_mac_table(&self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        self.state().set_mac_table(macs)
    }

    /// Replace the multicast list: up to [`MAX_MC_ADDRS`](crate::MAX_MC_ADDRS) multicast addresses
    /// passed without all-multicast; `InvalidArgument` for a unicast address.
    pub fn set_mc_list(&self, macs: &[[u8; 6]]) -> Result<(), HcaError> {
        self.state().set_mc_list(macs)
    }

    /// Promiscuous mode: every frame passes the MAC and VLAN filters.
    pub fn set_promisc(&self, on: bool) {
        self.state().set_promisc(on);
    }

    /// All-multicast mode: every multicast frame passes the MAC filter.
    pub fn set_allmulti(&self, on: bool) {
        self.state().set_allmulti(on);
    }

    /// Turn the VLAN filter on or off (off for a new adapter). While on and not promiscuous,
    /// a frame whose outer tag (802.1Q, 802.1ad, 0x9100) carries a VLAN ID not in the table
    /// is dropped as `rx_drops_vlan`; untagged and priority-tagged (ID 0) frames pass, as
    /// everything does while it is off.
    pub fn set_vlan_filtering(&self, on: bool) {
        self.state().set_vlan_filtering(on);
    }

    /// Add (`member`) or remove VLAN ID `vid` (below 4096) of the VLAN filter table.
    pub fn set_vlan(&self, vid: u16, member: bool) -> Result<(), HcaError> {
        self.state().set_vlan(vid, member)
    }

    /// The receive filters in force.
    pub fn rx_filter(&self) -> RxFilter {
        self.state().rx_filter()
    }

    /// Set the port's flow control (pause) settings; `InvalidArgument` if `low_water` is above
    /// `high_water`. Stored and reported only: the model sends no pause frame and honours
    /// none (see [`FlowControl`]).
    pub fn set_flow_control(&self, fc: &FlowControl) -> Result<(), HcaError> {
        self.state().set_flow_control(*fc)
    }

    /// The flow control settings ([`FlowControl::default`], mlx4_en's, until set).
    pub fn flow_control(&self) -> FlowControl {
        self.state().flow_control()
    }

    /// Create an RSS context (its own key, hashed fields and RQ table) for flow rules with
    /// [`FlowAction::Rss`](crate::FlowAction::Rss); its id. The RQs must exist (one destroyed
    /// later makes its share of frames drop, as `rx_drops_no_wqe`). Up to
    /// [`MAX_RSS_CONTEXTS`](crate::MAX_RSS_CONTEXTS).
    pub fn create_rss_context(&self, ctx: &RssContext) -> Result<u32, HcaError> {
        self.state().create_rss_context(ctx.clone())
    }

    /// Destroy an RSS context (`Busy` while rules use it).
    pub fn destroy_rss_context(&self, id: u32) -> Result<(), HcaError> {
        self.state().destroy_rss_context(id)
    }

    /// An RSS context's settings.
    pub fn rss_context(&self, id: u32) -> Result<RssContext, HcaError> {
        self.state()
            .rss_context(id)
            .ok_or(HcaError::NotFound("RSS context", id))
    }

    /// Add a flow rule; its id. Every received frame is checked against the rules, lowest
    /// priority first (the older first among equals), before the port's default path: the
    /// first rule that matches decides (its RQ, its RSS context's RQs, or a drop counted as
    /// `rx_drops_flow`), and the MAC and VLAN filters and the default RSS do not apply to it;
    /// the MTU does. Frames no rule matches take the default path. The queue or context must
    /// exist. Up to [`MAX_FLOWS`](crate::MAX_FLOWS).
    pub fn create_flow(&self, rule: &FlowRule) -> Result<u32, HcaError> {
        self.state().create_flow(rule)
    }

    /// Deliver only what flow rules take (`on`): frames no rule matches are dropped as
    /// `rx_drops_filter`, as device-managed flow steering with no default rule does (what a
    /// verbs device is; the verbs stand-in turns it on). Off by default: such frames take the
    /// default path.
    pub fn set_flows_only(&self, on: bool) {
        self.state().set_flows_only(on);
    }

    /// Remove a flow rule.
    pub fn destroy_flow(&self, id: u32) -> Result<(), HcaError> {
        self.state().destroy_flow(id)
    }

    /// Frames and bytes a rule matched so far.
    pub fn flow_counters(&self, id: u32) -> Result<FlowCounters, HcaError> {
        self.state().flow_counters(id)
    }

    /// Every rule with its id, in the order they are checked.
    pub fn flows(&self) -> Vec<(u32, FlowRule)> {
        self.state().flows()
    }

    /// Set the MTU (default 1500): received frames whose L3 length (frame length minus the
    /// 14-byte MAC header and 4 bytes per VLAN tag) exceeds it are dropped as `rx_drops_mtu`.
    /// Transmitted frames are not checked: what the driver may post is the driver's concern
    /// (it knows its MTU, and LSO frames are far above it by design), and a device that
    /// silently dropped them would only hide a driver bug behind a successful completion.
    ///
    /// A TAP wire's interface takes the same MTU, wherever it is now; the error is the
    /// kernel's refusal (the port's own MTU is set all the same).
    pub fn set_mtu(&self, mtu: u16) -> Result<(), HcaError> {
        self.state()
            .set_mtu(mtu)
            .map_err(|e| HcaError::Io(format!("MTU {mtu} on the TAP interface: {e}")))
    }

    /// The MTU in use.
    pub fn mtu(&self) -> u16 {
        self.state().mtu()
    }

    /// Plug the port into a wire (replacing the previous one).
    pub fn set_wire(&self, wire: Wire) -> Result<(), HcaError> {
        // Frames from outside: the device must look at the wire itself to receive.
        let rx = matches!(wire, Wire::Tap(_) | Wire::Cable(_));
        let port = wire::WirePort::open(wire)?;
        self.state().set_wire(port);
        self.shared.inner.wire_rx.store(rx, Ordering::Relaxed);
        Ok(())
    }

    /// Describe the current wire (`null`, `loop`, `peer:<name>`, `pcap`, `tap:<if>`,
    /// `cable:<path>`, `sink`).
    pub fn wire(&self) -> String {
        self.state().wire_name()
    }

    /// Set the link state. While down, transmitted frames are dropped (their WQEs still
    /// complete) and nothing is received.
    pub fn set_port_up(&self, up: bool) {
        self.state().set_port_up(up);
    }

    /// Whether the port is up as set ([`Hca::set_port_up`], not down by an injected flap,
    /// not removed): whether it sends and receives. The wire's carrier is not part of it; see
    /// [`Hca::link_up`].
    pub fn port_up(&self) -> bool {
        self.shared.inner.port.up()
    }

    /// The link as a PHY reports it: the port up ([`Hca::port_up`]) and its wire with a
    /// carrier (a cable's far end plugged in and up, its process alive; a TAP interface up; a
    /// peer adapter open and up; always for null, loop, pcap and sink). Looked at now; a
    /// change from what was last reported queues an event.
    pub fn link_up(&self) -> bool {
        self.state().check_link()
    }

    /// The port's event fd: an `eventfd`, non-blocking, readable while events wait in
    /// [`Hca::next_event`] (link up and down, removal). A DPDK driver registers it with EAL's
    /// interrupt thread and calls `next_event` until `None` in the callback. Asking for it also
    /// has the link monitor look for changes at the far end of the wire every
    /// [`MONITOR_PERIOD`](crate::MONITOR_PERIOD); changes the driver makes itself are queued at
    /// once. The fd belongs to the adapter and stays valid until its last handle is dropped.
    pub fn event_fd(&self) -> Result<std::os::fd::RawFd, HcaError> {
        monitor::watch(&self.shared.inner)?;
        Ok(self.shared.inner.events.fd())
    }

    /// The oldest port event not yet taken; `None` when there is none (the event fd is then
    /// not readable).
    pub fn next_event(&self) -> Option<PortEvent> {
        self.shared.inner.events.pop()
    }

    /// Create a completion channel (what `ibv_create_comp_channel` gives): CQs bound to it
    /// ([`Hca::set_cq_channel`]) report their completion events there, behind an event fd
    /// ([`Hca::comp_channel_fd`]). A CQ is armed by the CQ doorbell, a 64-bit big-endian store
    /// of `(sn << 28 | cmd << 24 | cqn) << 32 | ci` at offset 0x20 of any UAR page of the
    /// adapter (an SQ's, or one from [`Hca::alloc_uar`]), `cmd` 2 for the next completion, 1
    /// for the next solicited one (a send WQE with srcrb SOLICIT, or an error); received
    /// frames are not solicited. One event per arming: the first such completion after the
    /// arm raises it (at once if CQEs past `ci` were already written), then the CQ is
    /// disarmed until the next arm doorbell. In the polled mode the link monitor runs the
    /// device every [`SERVICE_PERIOD`](crate::SERVICE_PERIOD) while a channel exists, so events
    /// come while the lcore sleeps.
    pub fn create_comp_channel(&self) -> Result<u32, HcaError> {
        let id = self.state().create_channel()?;
        if !self.shared.threaded {
            monitor::watch(&self.shared.inner)?;
        }
        Ok(id)
    }

    /// The channel's event fd: an `eventfd`, readable while events wait in
    /// [`Hca::next_cq_event`]; blocking until its user sets `O_NONBLOCK` (as a verbs channel
    /// fd), which `next_cq_event` never needs. Valid until the channel is destroyed.
    pub fn comp_channel_fd(&self, channel: u32) -> Result<std::os::fd::RawFd, HcaError> {
        Ok(self.state().channel(channel)?.fd())
    }

    /// The CQN of the oldest completion event on `channel`, `None` when there is none (the fd
    /// is then not readable).
    pub fn next_cq_event(&self, channel: u32) -> Result<Option<u32>, HcaError> {
        let ch = self.state().channel(channel)?;
        Ok(ch.pop())
    }

    /// Destroy a completion channel (`Busy` while CQs are bound to it).
    pub fn destroy_comp_channel(&self, channel: u32) -> Result<(), HcaError> {
        self.state().destroy_channel(channel)
    }

    /// Bind CQ `cqn` to `channel` (`None`: no channel; its events are then lost).
    pub fn set_cq_channel(&self, cqn: u32, channel: Option<u32>) -> Result<(), HcaError> {
        self.state().set_cq_channel(cqn, channel)
    }

    /// Surprise removal, as when a card is hot-unplugged: the link goes down, nothing is
    /// executed, sent or received any more, and [`PortEvent::Removed`] is queued. For good:
    /// the adapter can only be dropped.
    pub fn remove(&self) {
        self.state().remove();
    }

    /// Whether the adapter was removed ([`Hca::remove`], or its cable file was deleted).
    pub fn removed(&self) -> bool {
        self.state().removed()
    }
}
