/*
 * mlx4rs-txcheck: sends a fixed number of UDP frames on the first net_mlx4rs port and checks
 * that the port's counters and the device's own frame counter agree with what was sent.
 *
 *   mlx4rs-txcheck <EAL args, e.g. --no-huge -m 512 --no-pci --vdev net_mlx4rs0> \
 *       [-- --packets N --size BYTES]
 *
 * The driver is linked in (libdpdk-mlx4rs.pc), not loaded with -d: that is what this checks.
 * Prints one "txcheck: PASS ..." or "txcheck: FAIL ..." line; exit code 0 or 1.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_byteorder.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#define DRIVER "net_mlx4rs"
#define BURST 32
#define RING 512

static int fail(const char *why)
{
	printf("txcheck: FAIL: %s\n", why);
	fflush(stdout);
	return 1;
}

static bool find_port(uint16_t *port)
{
	uint16_t p;

	RTE_ETH_FOREACH_DEV(p) {
		struct rte_eth_dev_info info;

		if (rte_eth_dev_info_get(p, &info) == 0 && strcmp(info.driver_name, DRIVER) == 0) {
			*port = p;
			return true;
		}
	}
	return false;
}

/* A fixed UDP/IPv4 frame of `size` bytes (without FCS); the counters, not the bytes, are
 * what this application checks, but a valid frame keeps captures readable. */
static void fill_frame(struct rte_mbuf *m, const struct rte_ether_addr *src, uint16_t size)
{
	struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	uint16_t l3_len = size - sizeof(*eth);

	memset(eth, 0, size);
	memset(&eth->dst_addr, 0xff, sizeof(eth->dst_addr));
	rte_ether_addr_copy(src, &eth->src_addr);
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->total_length = rte_cpu_to_be_16(l3_len);
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = rte_cpu_to_be_32(RTE_IPV4(198, 18, 0, 1));
	ip->dst_addr = rte_cpu_to_be_32(RTE_IPV4(198, 18, 0, 2));
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	udp->src_port = rte_cpu_to_be_16(9);
	udp->dst_port = rte_cpu_to_be_16(9);
	udp->dgram_len = rte_cpu_to_be_16(l3_len - sizeof(*ip));
	m->data_len = size;
	m->pkt_len = size;
}

static bool xstat(uint16_t port, const char *name, uint64_t *value)
{
	uint64_t id;

	return rte_eth_xstats_get_id_by_name(port, name, &id) == 0 &&
	       rte_eth_xstats_get_by_id(port, &id, value, 1) == 1;
}

static uint64_t ms_to_cycles(uint64_t ms)
{
	return rte_get_timer_hz() / 1000 * ms;
}

int main(int argc, char **argv)
{
	uint64_t packets = 1000, size = 64;
	int n = rte_eal_init(argc, argv);

	if (n < 0)
		return fail("EAL init failed");
	argc -= n;
	argv += n;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--packets") == 0 && i + 1 < argc)
			packets = strtoull(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
			size = strtoull(argv[++i], NULL, 0);
		else
			return fail("usage: mlx4rs-txcheck <EAL args> -- [--packets N] [--size BYTES]");
	}
	if (packets == 0 || size < 60 || size > 1500)
		return fail("--packets must be > 0 and --size 60..1500");

	uint16_t port;
	if (!find_port(&port))
		return fail("no " DRIVER " port: is the driver linked or installed, and --vdev given?");

	int socket = rte_eth_dev_socket_id(port);
	if (socket < 0)
		socket = (int)rte_socket_id();
	struct rte_mempool *pool = rte_pktmbuf_pool_create("txcheck", 2 * RING + 2 * BURST, 0, 0,
							    RTE_MBUF_DEFAULT_BUF_SIZE, socket);
	if (pool == NULL)
		return fail("cannot create the mbuf pool");

	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	if (rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
	    rte_eth_rx_queue_setup(port, 0, RING, socket, NULL, pool) != 0 ||
	    rte_eth_tx_queue_setup(port, 0, RING, socket, NULL) != 0 ||
	    rte_eth_dev_start(port) != 0)
		return fail("cannot configure and start the port");
	rte_eth_stats_reset(port);
	rte_eth_xstats_reset(port);

	struct rte_ether_addr mac;
	rte_eth_macaddr_get(port, &mac);

	/* A full ring only means the device has not caught up yet: retry the rest of the
	 * burst until the deadline, so every one of `packets` frames is handed over. */
	uint64_t sent = 0;
	uint64_t deadline = rte_get_timer_cycles() + ms_to_cycles(10000);
	while (sent < packets) {
		struct rte_mbuf *burst[BURST];
		uint16_t want = RTE_MIN((uint64_t)BURST, packets - sent), done = 0;

		if (rte_pktmbuf_alloc_bulk(pool, burst, want) != 0) {
			if (rte_get_timer_cycles() > deadline)
				return fail("mbufs were never returned by TX completions");
			continue;
		}
		for (uint16_t i = 0; i < want; i++)
			fill_frame(burst[i], &mac, (uint16_t)size);
		while (done < want) {
			done += rte_eth_tx_burst(port, 0, burst + done, want - done);
			if (done < want && rte_get_timer_cycles() > deadline) {
				rte_pktmbuf_free_bulk(burst + done, want - done);
				printf("txcheck: FAIL: only %" PRIu64 " of %" PRIu64
				       " packets accepted before the deadline\n",
				       sent + done, packets);
				return 1;
			}
		}
		sent += want;
	}

	/* The device runs on its own thread: its counter may trail the driver's for a while. */
	struct rte_eth_stats st;
	uint64_t frames = 0;
	bool ok = false;
	deadline = rte_get_timer_cycles() + ms_to_cycles(3000);
	do {
		if (rte_eth_stats_get(port, &st) != 0 || !xstat(port, "hca_tx_frames", &frames))
			return fail("cannot read the port's stats or the xstat hca_tx_frames");
		ok = st.opackets == packets && frames == packets;
		if (!ok)
			rte_delay_ms(10);
	} while (!ok && rte_get_timer_cycles() < deadline);

	uint64_t doorbells = 0, bf = 0, inl = 0, bf_path = 0;
	xstat(port, "tx_doorbells", &doorbells);
	xstat(port, "tx_bf_writes", &bf);
	xstat(port, "tx_inline_packets", &inl);
	xstat(port, "tx_path_bf", &bf_path);
	printf("txcheck: %s: port %u sent %" PRIu64 " x %" PRIu64 " B: opackets %" PRIu64
	       ", hca_tx_frames %" PRIu64 ", tx_doorbells %" PRIu64 ", tx_bf_writes %" PRIu64
	       ", tx_inline_packets %" PRIu64 ", tx_path_bf %" PRIu64 "\n",
	       ok ? "PASS" : "FAIL", port, packets, size, st.opackets, frames, doorbells, bf,
	       inl, bf_path);
	fflush(stdout);

	rte_eth_dev_stop(port);
	rte_eth_dev_close(port);
	rte_eal_cleanup();
	return ok ? 0 : 1;
}
