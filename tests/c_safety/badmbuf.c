/*
 * badmbuf: what a careless C application can hand the driver, one case
 * per run, against the first net_mlx4rs port (the test gives it a pcap wire):
 *
 *   badmbuf <EAL args> -- <case>
 *
 * A TX case sends one burst: a good frame, the bad mbuf, a good frame. The driver must take
 * all three, send the two good ones (printed as "frame <hex>" for the test to find on the
 * wire), refuse the bad one (oerrors 1, tx_bad_mbufs 1), and free every buffer exactly once
 * (the pool has no cache, so its counts are exact). The "rss" case queries the RSS key into
 * buffers too small and large enough, with guard bytes after them.
 *
 * The "stopped" case bursts on a stopped TX queue (and polls a stopped RX queue): the bursts
 * must take nothing and touch nothing (the counters and the pool stay as they were), and the
 * queue, started again, sends. The "restart" case stops and starts the queues with DPDK's
 * heap exhausted: a start must bring the same rings back, allocating nothing, and send.
 *
 * Prints "badmbuf: PASS <case> ..." or "badmbuf: FAIL <case>: why"; exit code 0 or 1. A case
 * that makes the driver abort or hang shows as no PASS line (the test kills a hung run).
 */
#include <errno.h>
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
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_tcp.h>
#include <rte_udp.h>

#define DRIVER "net_mlx4rs"
#define POOL_SIZE 255

static const char *cname = "?";

static int fail(const char *why)
{
	printf("badmbuf: FAIL %s: %s\n", cname, why);
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

/* Ethernet + IPv4 + TCP (tcp) or UDP headers for a frame of `size` bytes at `p`, the payload
 * a pattern from `seed`. */
static void frame(uint8_t *p, uint16_t size, uint8_t seed, bool tcp)
{
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	uint16_t l3_len = size - sizeof(*eth);

	for (uint16_t i = 0; i < size; i++)
		p[i] = (uint8_t)(seed + i);
	memset(&eth->dst_addr, 0xff, sizeof(eth->dst_addr));
	memset(&eth->src_addr, 0x02, sizeof(eth->src_addr));
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	memset(ip, 0, sizeof(*ip));
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->total_length = rte_cpu_to_be_16(l3_len);
	ip->time_to_live = 64;
	ip->next_proto_id = tcp ? IPPROTO_TCP : IPPROTO_UDP;
	ip->src_addr = rte_cpu_to_be_32(RTE_IPV4(198, 18, 0, 1));
	ip->dst_addr = rte_cpu_to_be_32(RTE_IPV4(198, 18, 0, 2));
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	if (tcp) {
		struct rte_tcp_hdr *t = (struct rte_tcp_hdr *)(ip + 1);

		memset(t, 0, sizeof(*t));
		t->src_port = rte_cpu_to_be_16(9);
		t->dst_port = rte_cpu_to_be_16(9);
		t->data_off = 5 << 4;
		t->tcp_flags = RTE_TCP_ACK_FLAG;
	} else {
		struct rte_udp_hdr *u = (struct rte_udp_hdr *)(ip + 1);

		u->src_port = rte_cpu_to_be_16(9);
		u->dst_port = rte_cpu_to_be_16(9);
		u->dgram_len = rte_cpu_to_be_16(l3_len - sizeof(*ip));
		u->dgram_cksum = 0;
	}
}

static struct rte_mbuf *alloc(struct rte_mempool *pool)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(pool);

	if (m == NULL) {
		fail("mempool empty");
		exit(1);
	}
	return m;
}

/* A good 64-byte UDP frame, printed for the test to find on the wire. */
static struct rte_mbuf *good(struct rte_mempool *pool, uint8_t seed)
{
	struct rte_mbuf *m = alloc(pool);
	uint8_t *p = rte_pktmbuf_mtod(m, uint8_t *);

	frame(p, 64, seed, false);
	m->data_len = 64;
	m->pkt_len = 64;
	printf("frame ");
	for (int i = 0; i < 64; i++)
		printf("%02x", p[i]);
	printf("\n");
	return m;
}

/* Segment `m` of `len` bytes, data from `seed`. */
static struct rte_mbuf *seg(struct rte_mempool *pool, uint16_t len, uint8_t seed)
{
	struct rte_mbuf *m = alloc(pool);

	for (uint16_t i = 0; i < len; i++)
		rte_pktmbuf_mtod(m, uint8_t *)[i] = (uint8_t)(seed + i);
	m->data_len = len;
	m->pkt_len = len;
	return m;
}

static bool xstat(uint16_t port, const char *name, uint64_t *value)
{
	uint64_t id;

	return rte_eth_xstats_get_id_by_name(port, name, &id) == 0 &&
	       rte_eth_xstats_get_by_id(port, &id, value, 1) == 1;
}

static int rss_case(uint16_t port)
{
	uint8_t key[64];
	struct rte_eth_rss_conf conf;
	int ret;

	/* Too small: refused, nothing written. */
	memset(key, 0xaa, sizeof(key));
	memset(&conf, 0, sizeof(conf));
	conf.rss_key = key;
	conf.rss_key_len = 16;
	ret = rte_eth_dev_rss_hash_conf_get(port, &conf);
	for (size_t i = 0; i < sizeof(key); i++)
		if (key[i] != 0xaa) {
			printf("byte %zu of a 16-byte key buffer written (ret %d)\n", i, ret);
			return fail("the driver wrote past rss_key_len");
		}
	if (ret != -EINVAL)
		return fail("rss_key_len 16 not refused with -EINVAL");
	/* Exactly the key's size, and more: 40 bytes written, no more, rss_key_len 40. */
	for (int len = 40; len <= 52; len += 12) {
		memset(key, 0xaa, sizeof(key));
		conf.rss_key = key;
		conf.rss_key_len = len;
		ret = rte_eth_dev_rss_hash_conf_get(port, &conf);
		if (ret != 0)
			return fail("rss_key_len >= 40 refused");
		for (size_t i = 40; i < sizeof(key); i++)
			if (key[i] != 0xaa)
				return fail("the driver wrote past the 40-byte key");
		if (conf.rss_key_len != 40)
			return fail("rss_key_len not set to 40");
	}
	/* No key buffer: the hash types only. */
	conf.rss_key = NULL;
	conf.rss_key_len = 0;
	if (rte_eth_dev_rss_hash_conf_get(port, &conf) != 0)
		return fail("query without a key refused");
	printf("badmbuf: PASS rss: 16 -> -EINVAL, nothing written; 40 and 52 -> 40 bytes\n");
	return 0;
}

/* Waits (with a deadline) until the port has sent `want` packets. */
static bool wait_opackets(uint16_t port, uint64_t want, struct rte_eth_stats *st)
{
	uint64_t deadline = rte_get_timer_cycles() + 5 * rte_get_timer_hz();

	for (;;) {
		rte_eth_tx_done_cleanup(port, 0, 0);
		if (rte_eth_stats_get(port, st) != 0)
			return false;
		if (st->opackets == want)
			return true;
		if (rte_get_timer_cycles() > deadline) {
			printf("opackets %" PRIu64 ", want %" PRIu64 "\n", st->opackets, want);
			return false;
		}
		rte_delay_us_sleep(1000);
	}
}

static int stopped_case(uint16_t port, struct rte_mempool *pool)
{
	struct rte_eth_stats st;
	struct rte_mbuf *first = good(pool, 1);

	if (rte_eth_tx_burst(port, 0, &first, 1) != 1)
		return fail("the first frame was not taken");
	if (!wait_opackets(port, 1, &st))
		return fail("the first frame was not sent");
	if (rte_eth_dev_tx_queue_stop(port, 0) != 0 || rte_eth_dev_rx_queue_stop(port, 0) != 0)
		return fail("queue stop");
	unsigned int base = rte_mempool_in_use_count(pool);
	struct rte_mbuf *pkts[3];
	for (int i = 0; i < 3; i++) {
		pkts[i] = seg(pool, 64, (uint8_t)(10 + i));
		frame(rte_pktmbuf_mtod(pkts[i], uint8_t *), 64, (uint8_t)(10 + i), false);
	}
	struct rte_mbuf *rx[8];
	for (int round = 0; round < 100; round++) {
		uint16_t took = rte_eth_tx_burst(port, 0, pkts, 3);
		uint16_t got = rte_eth_rx_burst(port, 0, rx, 8);

		if (took != 0 || got != 0) {
			printf("a stopped TX queue took %u, a stopped RX queue gave %u\n", took, got);
			return fail("a stopped queue's burst touched the queue");
		}
		rte_eth_tx_burst(port, 0, NULL, 0);
		rte_eth_tx_done_cleanup(port, 0, 0);
	}
	if (rte_eth_stats_get(port, &st) != 0)
		return fail("stats_get");
	unsigned int in_use = rte_mempool_in_use_count(pool);
	if (st.opackets != 1 || st.oerrors != 0 || in_use != base + 3) {
		printf("opackets %" PRIu64 ", oerrors %" PRIu64 ", in use %u (%u + 3 expected)\n",
		       st.opackets, st.oerrors, in_use, base);
		return fail("bursts on a stopped queue changed the counters or the pool");
	}
	for (int i = 0; i < 3; i++)
		rte_pktmbuf_free(pkts[i]);
	if (rte_eth_dev_tx_queue_start(port, 0) != 0 || rte_eth_dev_rx_queue_start(port, 0) != 0)
		return fail("queue start");
	struct rte_mbuf *again = good(pool, 2);
	if (rte_eth_tx_burst(port, 0, &again, 1) != 1)
		return fail("the started queue took nothing");
	if (!wait_opackets(port, 2, &st))
		return fail("the started queue did not send");
	printf("badmbuf: PASS stopped: 100 rounds of bursts on the stopped queues took and gave nothing; opackets %" PRIu64
	       ", oerrors %" PRIu64 "\n",
	       st.opackets, st.oerrors);
	if (rte_eth_dev_stop(port) != 0)
		return fail("stop");
	rte_eth_dev_close(port);
	rte_eal_cleanup();
	return 0;
}

/* Takes every byte of DPDK's heap it can get (at most `cap` blocks, halving the size on each
 * refusal down to 64 bytes); returns how many blocks it holds in `held`. */
static unsigned int fill_heap(void **held, unsigned int cap)
{
	unsigned int n = 0;

	for (size_t size = 64u << 20; size >= 64 && n < cap;) {
		void *p = rte_malloc("badmbuf_fill", size, 0);

		if (p == NULL)
			size /= 2;
		else
			held[n++] = p;
	}
	return n;
}

#define FILL_CAP 4096

/* Queue stop and start with DPDK's heap exhausted: a start that brings the same rings back
 * needs no memory, one that makes new device queues fails. Three cycles, a frame sent after
 * each start. */
static int restart_case(uint16_t port, struct rte_mempool *pool)
{
	static void *held[FILL_CAP];
	struct rte_eth_stats st;
	struct rte_mbuf *m = good(pool, 1);

	if (rte_eth_tx_burst(port, 0, &m, 1) != 1)
		return fail("the first frame was not taken");
	if (!wait_opackets(port, 1, &st))
		return fail("the first frame was not sent");
	unsigned int n = fill_heap(held, FILL_CAP);
	if (n == FILL_CAP || rte_malloc("badmbuf_probe", 64, 0) != NULL)
		return fail("DPDK's heap could not be filled");
	int bad = 0;
	for (int cycle = 0; cycle < 3 && !bad; cycle++) {
		if (rte_eth_dev_tx_queue_stop(port, 0) != 0 || rte_eth_dev_rx_queue_stop(port, 0) != 0) {
			bad = fail("queue stop");
		} else if (rte_eth_dev_tx_queue_start(port, 0) != 0) {
			bad = fail("TX queue start with no memory to spare: it allocated");
		} else if (rte_eth_dev_rx_queue_start(port, 0) != 0) {
			bad = fail("RX queue start with no memory to spare: it allocated");
		} else {
			m = good(pool, (uint8_t)(2 + cycle));
			if (rte_eth_tx_burst(port, 0, &m, 1) != 1)
				bad = fail("the restarted queue took nothing");
			else if (!wait_opackets(port, (uint64_t)cycle + 2, &st))
				bad = fail("the restarted queue did not send");
		}
	}
	for (unsigned int i = 0; i < n; i++)
		rte_free(held[i]);
	if (bad)
		return bad;
	printf("badmbuf: PASS restart: 3 stop/start cycles with the heap full (%u blocks held); opackets %" PRIu64
	       ", oerrors %" PRIu64 "\n",
	       n, st.opackets, st.oerrors);
	if (rte_eth_dev_stop(port) != 0)
		return fail("stop");
	rte_eth_dev_close(port);
	rte_eal_cleanup();
	return 0;
}

int main(int argc, char **argv)
{
	int n = rte_eal_init(argc, argv);

	if (n < 0)
		return fail("EAL init failed");
	argc -= n;
	argv += n;
	if (argc != 2)
		return fail("usage: badmbuf <EAL args> -- <case>");
	cname = argv[1];
	setvbuf(stdout, NULL, _IOLBF, 0);

	uint16_t port;
	if (!find_port(&port))
		return fail("no " DRIVER " port: is the plugin loaded (-d) and --vdev given?");
	struct rte_eth_dev_info info;
	if (rte_eth_dev_info_get(port, &info) != 0)
		return fail("dev_info_get");
	struct rte_mempool *pool = rte_pktmbuf_pool_create("badmbuf", POOL_SIZE, 0, 0,
							    RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
	if (pool == NULL)
		return fail("mempool create");
	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	uint64_t want = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_TCP_CKSUM |
			RTE_ETH_TX_OFFLOAD_TCP_TSO | RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	conf.txmode.offloads = want & info.tx_offload_capa;
	if (rte_eth_dev_configure(port, 1, 1, &conf) != 0)
		return fail("configure");
	if (rte_eth_rx_queue_setup(port, 0, 64, SOCKET_ID_ANY, NULL, pool) != 0)
		return fail("rx queue setup");
	if (rte_eth_tx_queue_setup(port, 0, 64, SOCKET_ID_ANY, NULL) != 0)
		return fail("tx queue setup");
	if (rte_eth_dev_start(port) != 0)
		return fail("start");
	if (strcmp(cname, "rss") == 0)
		return rss_case(port);
	if (strcmp(cname, "stopped") == 0)
		return stopped_case(port, pool);
	if (strcmp(cname, "restart") == 0)
		return restart_case(port, pool);

	/* rx queue's buffers are out of the pool: the baseline. */
	unsigned int base = rte_mempool_in_use_count(pool);
	struct rte_mbuf *pkts[3];
	struct rte_mbuf *extra = NULL; /* a segment past nb_segs: the application's to free */
	pkts[0] = good(pool, 1);
	struct rte_mbuf *b;
	if (strcmp(cname, "csum_len") == 0) {
		/* Asks for the IP checksum; data_len 100, pkt_len 20. */
		b = seg(pool, 100, 7);
		frame(rte_pktmbuf_mtod(b, uint8_t *), 100, 7, false);
		b->pkt_len = 20;
		b->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
		b->l2_len = 14;
		b->l3_len = 20;
	} else if (strcmp(cname, "cycle") == 0) {
		/* Two empty segments pointing at each other, nb_segs 2. */
		b = seg(pool, 0, 0);
		struct rte_mbuf *c = seg(pool, 0, 0);
		b->next = c;
		c->next = b;
		b->nb_segs = 2;
		b->pkt_len = 0;
	} else if (strcmp(cname, "cycle3") == 0) {
		/* nb_segs 3, but the second segment points back to the first. */
		b = seg(pool, 60, 3);
		struct rte_mbuf *c = seg(pool, 40, 4);
		b->next = c;
		c->next = b;
		b->nb_segs = 3;
		b->pkt_len = 100;
	} else if (strcmp(cname, "oob") == 0) {
		/* A 2 KB buffer claiming 65535 bytes. */
		b = seg(pool, 64, 5);
		b->data_len = 65535;
		b->pkt_len = 65535;
	} else if (strcmp(cname, "oob_seg") == 0) {
		/* The second segment's data runs past its buffer. */
		b = seg(pool, 60, 3);
		struct rte_mbuf *c = seg(pool, 40, 4);
		c->data_off = c->buf_len - 8;
		b->next = c;
		b->nb_segs = 2;
		b->pkt_len = 100;
	} else if (strcmp(cname, "pkt_len") == 0) {
		/* Two segments of 60 and 40 bytes, pkt_len 80. */
		b = seg(pool, 60, 3);
		struct rte_mbuf *c = seg(pool, 40, 4);
		b->next = c;
		b->nb_segs = 2;
		b->pkt_len = 80;
	} else if (strcmp(cname, "short_chain") == 0) {
		/* nb_segs 3, two segments. */
		b = seg(pool, 60, 3);
		struct rte_mbuf *c = seg(pool, 40, 4);
		b->next = c;
		b->nb_segs = 3;
		b->pkt_len = 100;
	} else if (strcmp(cname, "long_chain") == 0) {
		/* nb_segs 2, three segments linked: the third is not the driver's. */
		b = seg(pool, 60, 3);
		struct rte_mbuf *c = seg(pool, 40, 4);
		extra = seg(pool, 20, 5);
		b->next = c;
		c->next = extra;
		b->nb_segs = 2;
		b->pkt_len = 100;
	} else if (strcmp(cname, "tso_mss0") == 0 || strcmp(cname, "tso_hdr") == 0) {
		bool hdr = strcmp(cname, "tso_hdr") == 0;
		/* TCP segmentation of a 1000-byte frame: tso_segsz 0, or the 54 bytes of headers
		 * spread over two segments (30 + 970). */
		uint8_t f[1000];
		frame(f, sizeof(f), 9, true);
		b = seg(pool, hdr ? 30 : 1000, 0);
		memcpy(rte_pktmbuf_mtod(b, uint8_t *), f, hdr ? 30 : 1000);
		if (hdr) {
			struct rte_mbuf *c = seg(pool, 970, 0);
			memcpy(rte_pktmbuf_mtod(c, uint8_t *), f + 30, 970);
			b->next = c;
			b->nb_segs = 2;
		}
		b->pkt_len = 1000;
		b->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_TCP_CKSUM |
			      RTE_MBUF_F_TX_TCP_SEG;
		b->l2_len = 14;
		b->l3_len = 20;
		b->l4_len = 20;
		b->tso_segsz = hdr ? 500 : 0;
	} else {
		return fail("unknown case");
	}
	pkts[1] = b;
	pkts[2] = good(pool, 2);

	uint16_t sent = rte_eth_tx_burst(port, 0, pkts, 3);
	if (sent != 3) {
		printf("tx_burst took %u of 3\n", sent);
		return fail("the burst did not go on past the bad mbuf");
	}
	/* Wait (with a deadline) for the two good frames and the counts. */
	struct rte_eth_stats st;
	uint64_t bad = 0;
	uint64_t deadline = rte_get_timer_cycles() + 5 * rte_get_timer_hz();
	for (;;) {
		rte_eth_tx_burst(port, 0, NULL, 0);
		rte_eth_tx_done_cleanup(port, 0, 0);
		if (rte_eth_stats_get(port, &st) != 0)
			return fail("stats_get");
		if (!xstat(port, "tx_bad_mbufs", &bad))
			return fail("no xstat tx_bad_mbufs");
		if (st.opackets == 2 && st.oerrors == 1 && bad == 1)
			break;
		if (rte_get_timer_cycles() > deadline) {
			printf("opackets %" PRIu64 " oerrors %" PRIu64 " tx_bad_mbufs %" PRIu64 "\n",
			       st.opackets, st.oerrors, bad);
			return fail("counts never reached opackets 2, oerrors 1, tx_bad_mbufs 1");
		}
		rte_delay_us_sleep(1000);
	}
	if (extra != NULL)
		rte_pktmbuf_free(extra);
	/* Everything the TX queue took is back, once: no cache, so the counts are exact (the RX
	 * queue, with nothing arriving, holds what it held). */
	unsigned int in_use = rte_mempool_in_use_count(pool);
	unsigned int avail = rte_mempool_avail_count(pool);
	if (avail > POOL_SIZE) {
		printf("avail %u of %u\n", avail, POOL_SIZE);
		return fail("a buffer was freed twice");
	}
	if (in_use != base) {
		printf("in use %u, %u before the burst\n", in_use, base);
		return fail("a buffer was not freed");
	}
	printf("badmbuf: PASS %s: opackets %" PRIu64 ", oerrors %" PRIu64 ", tx_bad_mbufs %" PRIu64
	       ", in use %u -> %u\n",
	       cname, st.opackets, st.oerrors, bad, base, in_use);
	if (rte_eth_dev_stop(port) != 0)
		return fail("stop");
	rte_eth_dev_close(port);
	rte_eal_cleanup();
	return 0;
}
