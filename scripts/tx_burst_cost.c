/*
 * tx_burst_cost: pushes full bursts of 64-byte UDP frames (testpmd's txonly frame) through the
 * first port's TX queue, one call at a time, through a function of its own, `measured_tx`, so
 * that callgrind can count the driver's tx_burst per packet whatever driver the port has
 * (Debian's librte_net_mlx4.so is stripped; its tx_burst has no symbol to toggle on).
 *
 * Between calls it sleeps, so the device drains the ring and every measured call sends the
 * whole burst: the count is the driver's per-packet cost, not that of calls finding the ring
 * full. Calls that sent less are counted and reported.
 *
 *   valgrind --tool=callgrind --fair-sched=yes --toggle-collect=measured_tx \
 *       ./tx_burst_cost <EAL args> -- [--bursts N] [--burst B] [--wait-us U]
 *
 * Prints "tx_burst_cost: driver D bursts N burst B packets P short S".
 *
 * With --rx 1 it counts rx_burst instead, through `measured_rx`, on a port whose wire loops
 * frames back (wire=loop): each round sends a burst to the port's own MAC unmeasured, sleeps
 * so the device delivers it, and makes one measured rx_burst call, which takes the frames and
 * refills the ring from the mempool. Calls that received less than the burst are counted as
 * short; every frame received is checked for its length and freed, unmeasured.
 *
 *   valgrind --tool=callgrind --fair-sched=yes --toggle-collect=measured_rx \
 *       ./tx_burst_cost <EAL args> -- --rx 1 [--bursts N] [--burst B] [--wait-us U]
 *
 * Prints "rx_burst_cost: driver D bursts N burst B packets P short S".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_byteorder.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#define RING 512
#define FRAME 64

/* The call callgrind counts: nothing but the burst. */
__attribute__((noinline)) uint16_t
measured_tx(uint16_t port, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, 0, pkts, n);
}

/* The RX call callgrind counts. */
__attribute__((noinline)) uint16_t
measured_rx(uint16_t port, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, 0, pkts, n);
}

static void
fill(struct rte_mbuf *m, const struct rte_ether_addr *src, int to_self)
{
	struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);

	memset(eth, 0, FRAME);
	eth->src_addr = *src;
	if (to_self)
		eth->dst_addr = *src;
	else
		eth->dst_addr.addr_bytes[0] = 0x02;
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->total_length = rte_cpu_to_be_16(FRAME - sizeof(*eth));
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = rte_cpu_to_be_32(0xc6120001); /* 198.18.0.1 */
	ip->dst_addr = rte_cpu_to_be_32(0xc6120002); /* 198.18.0.2 */
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	udp->src_port = rte_cpu_to_be_16(9);
	udp->dst_port = rte_cpu_to_be_16(9);
	udp->dgram_len = rte_cpu_to_be_16(FRAME - sizeof(*eth) - sizeof(*ip));
	m->data_len = FRAME;
	m->pkt_len = FRAME;
}

int
main(int argc, char **argv)
{
	unsigned long bursts = 2000, burst = 32, wait_us = 2000, short_calls = 0, sent = 0, rx = 0;
	struct rte_eth_conf conf = { 0 };
	struct rte_eth_dev_info info;
	struct rte_ether_addr mac;
	struct rte_mempool *mp;
	uint16_t port = 0;
	int n, i;

	n = rte_eal_init(argc, argv);
	if (n < 0) {
		fprintf(stderr, "tx_burst_cost: EAL init failed\n");
		return 1;
	}
	argc -= n;
	argv += n;
	for (i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--bursts"))
			bursts = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--burst"))
			burst = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--wait-us"))
			wait_us = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--rx"))
			rx = strtoul(argv[i + 1], NULL, 0);
	}
	if (rte_eth_dev_count_avail() == 0 || burst == 0 || burst > 64) {
		fprintf(stderr, "tx_burst_cost: no port, or burst not 1..64\n");
		return 1;
	}
	mp = rte_pktmbuf_pool_create("tx_burst_cost", 8191, 256, 0,
				     RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
	if (mp == NULL || rte_eth_dev_info_get(port, &info) != 0 ||
	    rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
	    rte_eth_rx_queue_setup(port, 0, RING, rte_socket_id(), NULL, mp) != 0 ||
	    rte_eth_tx_queue_setup(port, 0, RING, rte_socket_id(), NULL) != 0 ||
	    rte_eth_dev_start(port) != 0 || rte_eth_macaddr_get(port, &mac) != 0) {
		fprintf(stderr, "tx_burst_cost: port setup failed\n");
		return 1;
	}
	/* A warm-up of unmeasured bursts, then the measured ones. */
	for (unsigned long b = 0; b < bursts + 64; b++) {
		struct rte_mbuf *pkts[64];
		uint16_t k;

		if (rte_pktmbuf_alloc_bulk(mp, pkts, burst) != 0) {
			fprintf(stderr, "tx_burst_cost: out of mbufs\n");
			return 1;
		}
		for (k = 0; k < burst; k++)
			fill(pkts[k], &mac, rx != 0);
		if (rx) {
			unsigned long got = 0, calls = 0;

			k = rte_eth_tx_burst(port, 0, pkts, burst);
			if (k < burst)
				rte_pktmbuf_free_bulk(pkts + k, burst - k);
			usleep(wait_us);
			/* The measured call, then unmeasured ones for whatever it left. */
			while (got < k && calls++ < 1000) {
				uint16_t r = b >= 64 && calls == 1 ?
						     measured_rx(port, pkts, burst) :
						     rte_eth_rx_burst(port, 0, pkts, burst);

				if (b >= 64 && calls == 1) {
					sent += r;
					short_calls += r != burst;
				}
				for (uint16_t j = 0; j < r; j++) {
					if (pkts[j]->pkt_len != FRAME) {
						fprintf(stderr, "rx_burst_cost: a %u-byte frame\n",
							pkts[j]->pkt_len);
						return 1;
					}
				}
				rte_pktmbuf_free_bulk(pkts, r);
				got += r;
				if (got < k)
					usleep(100);
			}
			continue;
		}
		k = b < 64 ? rte_eth_tx_burst(port, 0, pkts, burst) : measured_tx(port, pkts, burst);
		if (b >= 64) {
			sent += k;
			short_calls += k != burst;
		}
		if (k < burst)
			rte_pktmbuf_free_bulk(pkts + k, burst - k);
		usleep(wait_us);
	}
	printf("%s: driver %s bursts %lu burst %lu packets %lu short %lu\n",
	       rx ? "rx_burst_cost" : "tx_burst_cost", info.driver_name, bursts, burst, sent,
	       short_calls);
	fflush(stdout);
	rte_eth_dev_stop(port);
	rte_eth_dev_close(port);
	rte_eal_cleanup();
	return 0;
}
