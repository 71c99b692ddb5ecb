/*
 * flowfuzz: random rte_flow rules through rte_flow_validate, rte_flow_create and
 * rte_flow_destroy on the first net_mlx4rs port, seeded and bounded:
 *
 *   flowfuzz <EAL args> -- <seed> <iterations>
 *
 * Each iteration builds a random rule (attributes, up to six pattern items of the kinds a
 * NIC's rte_flow knows, with random spec/last/mask or none, and up to four actions with
 * random configurations), validates it and creates it. Checked for every rule:
 *   - validate and create agree: both succeed, or both fail with the same errno;
 *   - a refusal returns a negative errno, sets rte_errno to it and fills rte_flow_error with
 *     a type other than NONE and a non-empty message;
 *   - a created rule is destroyed without error (rules live at most 64 at a time, destroyed
 *     at random; a port stop and start in the middle keeps them).
 * Nothing leaks: the port takes as many simple rules at the end as on the fresh port at the
 * start, and they all go again; the port stops and closes cleanly.
 *
 * All pointed-to structures are large enough for the item or action type (DPDK's contract);
 * only their contents are random. Prints "flowfuzz: PASS ..." or "flowfuzz: FAIL ...".
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_flow.h>
#include <rte_mbuf.h>

#define DRIVER "net_mlx4rs"
#define NB_RXQ 4
#define MAX_LIVE 64
#define MAX_ITEMS 6
#define MAX_ACTIONS 4
/* Bytes behind every spec/last/mask/conf pointer: more than any struct used here. */
#define BLOB 256

static uint64_t rng;

static uint64_t rnd(void)
{
	/* xorshift64*: reproducible from the seed, no libc state. */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dULL;
}

static unsigned int below(unsigned int n)
{
	return (unsigned int)(rnd() % n);
}

static void fill(uint8_t *p, size_t n)
{
	size_t i;

	/* Mostly all-ones or all-zero bytes (full and empty masks), sometimes anything. */
	switch (below(4)) {
	case 0:
		memset(p, 0, n);
		break;
	case 1:
		memset(p, 0xff, n);
		break;
	default:
		for (i = 0; i < n; i++)
			p[i] = (uint8_t)rnd();
	}
}

static const enum rte_flow_item_type item_types[] = {
	RTE_FLOW_ITEM_TYPE_VOID, RTE_FLOW_ITEM_TYPE_ETH,  RTE_FLOW_ITEM_TYPE_ETH,
	RTE_FLOW_ITEM_TYPE_VLAN, RTE_FLOW_ITEM_TYPE_IPV4, RTE_FLOW_ITEM_TYPE_IPV4,
	RTE_FLOW_ITEM_TYPE_IPV6, RTE_FLOW_ITEM_TYPE_UDP,  RTE_FLOW_ITEM_TYPE_TCP,
	RTE_FLOW_ITEM_TYPE_ICMP, RTE_FLOW_ITEM_TYPE_SCTP, RTE_FLOW_ITEM_TYPE_VXLAN,
	RTE_FLOW_ITEM_TYPE_GRE,  RTE_FLOW_ITEM_TYPE_MPLS, RTE_FLOW_ITEM_TYPE_ANY,
};

struct rule {
	struct rte_flow_attr attr;
	struct rte_flow_item items[MAX_ITEMS + 1];
	struct rte_flow_action actions[MAX_ACTIONS + 1];
	uint8_t blobs[MAX_ITEMS * 3 + MAX_ACTIONS][BLOB];
	uint16_t queues[16];
	uint8_t key[BLOB];
	struct rte_flow_action_queue queue;
	struct rte_flow_action_rss rss;
	struct rte_flow_action_mark mark;
	struct rte_flow_action_count count;
	struct rte_flow_action_jump jump;
};

static void *blob_or_null(struct rule *r, int *b)
{
	uint8_t *p;

	if (below(3) == 0)
		return NULL;
	p = r->blobs[(*b)++];
	fill(p, BLOB);
	return p;
}

static void random_rule(struct rule *r)
{
	int n, i, b = 0;

	memset(r, 0, sizeof(*r));
	r->attr.ingress = below(10) != 0;
	r->attr.egress = below(10) == 0;
	r->attr.transfer = below(20) == 0;
	r->attr.group = below(8) == 0 ? (uint32_t)rnd() : 0;
	switch (below(4)) {
	case 0: r->attr.priority = 0; break;
	case 1: r->attr.priority = below(4096); break;
	case 2: r->attr.priority = 4095 + below(3); break;
	default: r->attr.priority = (uint32_t)rnd(); break;
	}

	n = (int)below(MAX_ITEMS + 1);
	for (i = 0; i < n; i++) {
		struct rte_flow_item *it = &r->items[i];

		it->type = item_types[below(RTE_DIM(item_types))];
		it->spec = blob_or_null(r, &b);
		it->last = below(6) == 0 ? blob_or_null(r, &b) : NULL;
		it->mask = blob_or_null(r, &b);
	}
	r->items[n].type = RTE_FLOW_ITEM_TYPE_END;

	n = (int)below(MAX_ACTIONS + 1);
	for (i = 0; i < n; i++) {
		struct rte_flow_action *a = &r->actions[i];
		unsigned int q;

		switch (below(10)) {
		case 0:
			a->type = RTE_FLOW_ACTION_TYPE_VOID;
			break;
		case 1:
		case 2:
			a->type = RTE_FLOW_ACTION_TYPE_QUEUE;
			r->queue.index = below(4) == 0 ? (uint16_t)rnd() : below(NB_RXQ + 2);
			a->conf = &r->queue;
			break;
		case 3:
			a->type = RTE_FLOW_ACTION_TYPE_DROP;
			break;
		case 4:
			a->type = RTE_FLOW_ACTION_TYPE_COUNT;
			r->count.id = (uint32_t)rnd();
			a->conf = below(2) ? &r->count : NULL;
			break;
		case 5:
		case 6:
			a->type = RTE_FLOW_ACTION_TYPE_RSS;
			r->rss.func = below(5);
			r->rss.level = below(4) ? 0 : below(3);
			r->rss.types = below(3) ? RTE_ETH_RSS_IP | (below(2) ? RTE_ETH_RSS_UDP : 0) : rnd();
			fill(r->key, BLOB);
			switch (below(4)) {
			case 0: r->rss.key_len = 0; break;
			case 1: r->rss.key_len = 40; break;
			default: r->rss.key_len = below(BLOB + 1); break;
			}
			r->rss.key = below(8) ? r->key : NULL;
			if (r->rss.key == NULL)
				r->rss.key_len = 0;
			r->rss.queue_num = below(RTE_DIM(r->queues) + 1);
			for (q = 0; q < RTE_DIM(r->queues); q++)
				r->queues[q] = below(8) ? below(NB_RXQ) : below(1024);
			r->rss.queue = r->rss.queue_num ? r->queues : NULL;
			a->conf = &r->rss;
			break;
		case 7:
			a->type = RTE_FLOW_ACTION_TYPE_MARK;
			r->mark.id = (uint32_t)rnd();
			a->conf = &r->mark;
			break;
		case 8:
			a->type = RTE_FLOW_ACTION_TYPE_FLAG;
			break;
		default:
			a->type = RTE_FLOW_ACTION_TYPE_JUMP;
			r->jump.group = below(4);
			a->conf = &r->jump;
			break;
		}
	}
	r->actions[n].type = RTE_FLOW_ACTION_TYPE_END;
}

/* A rule close to what the port accepts: ingress, group 0, a low priority; eth, vlan, ipv4,
 * tcp/udp in order (each perhaps left out), matching only the fields mlx4 steers on with
 * random values and masks; one fate and perhaps a count. Then, half the time, one random
 * change (an item's bytes, the attributes, or an action's configuration). */
static void plausible_rule(struct rule *r)
{
	int n = 0, a = 0, b = 0;

	memset(r, 0, sizeof(*r));
	r->attr.ingress = 1;
	r->attr.priority = below(4) ? 0 : below(4096);
	if (below(4)) {
		struct rte_flow_item_eth *spec = (void *)r->blobs[b++];
		struct rte_flow_item_eth *mask = (void *)r->blobs[b++];

		r->items[n].type = RTE_FLOW_ITEM_TYPE_ETH;
		if (below(2)) {
			fill(spec->hdr.dst_addr.addr_bytes, RTE_ETHER_ADDR_LEN);
			memset(mask->hdr.dst_addr.addr_bytes, 0xff, RTE_ETHER_ADDR_LEN);
			r->items[n].spec = spec;
			r->items[n].mask = mask;
		}
		n++;
	}
	if (below(4) == 0) {
		struct rte_flow_item_vlan *spec = (void *)r->blobs[b++];
		struct rte_flow_item_vlan *mask = (void *)r->blobs[b++];

		r->items[n].type = RTE_FLOW_ITEM_TYPE_VLAN;
		spec->hdr.vlan_tci = rte_cpu_to_be_16(below(4096));
		mask->hdr.vlan_tci = rte_cpu_to_be_16(0x0fff);
		if (below(2)) {
			r->items[n].spec = spec;
			r->items[n].mask = mask;
		}
		n++;
	}
	if (below(3)) {
		struct rte_flow_item_ipv4 *spec = (void *)r->blobs[b++];
		struct rte_flow_item_ipv4 *mask = (void *)r->blobs[b++];

		r->items[n].type = RTE_FLOW_ITEM_TYPE_IPV4;
		spec->hdr.src_addr = (uint32_t)rnd();
		spec->hdr.dst_addr = (uint32_t)rnd();
		mask->hdr.src_addr = below(2) ? 0 : rte_cpu_to_be_32(~0u << below(33) % 32);
		mask->hdr.dst_addr = below(2) ? 0xffffffff : (uint32_t)rnd();
		if (below(3)) {
			r->items[n].spec = spec;
			r->items[n].mask = mask;
		}
		n++;
		if (below(2)) {
			struct rte_flow_item_udp *l4 = (void *)r->blobs[b++];
			struct rte_flow_item_udp *l4m = (void *)r->blobs[b++];

			/* tcp and udp items begin with the same two ports */
			r->items[n].type = below(2) ? RTE_FLOW_ITEM_TYPE_UDP : RTE_FLOW_ITEM_TYPE_TCP;
			l4->hdr.src_port = (uint16_t)rnd();
			l4->hdr.dst_port = (uint16_t)rnd();
			l4m->hdr.src_port = below(2) ? 0 : (uint16_t)rnd();
			l4m->hdr.dst_port = 0xffff;
			if (below(3)) {
				r->items[n].spec = l4;
				r->items[n].mask = l4m;
			}
			n++;
		}
	}
	r->items[n].type = RTE_FLOW_ITEM_TYPE_END;

	switch (below(3)) {
	case 0:
		r->actions[a].type = RTE_FLOW_ACTION_TYPE_QUEUE;
		r->queue.index = below(NB_RXQ);
		r->actions[a++].conf = &r->queue;
		break;
	case 1:
		r->actions[a].type = RTE_FLOW_ACTION_TYPE_DROP;
		a++;
		break;
	default:
		r->actions[a].type = RTE_FLOW_ACTION_TYPE_RSS;
		r->rss.types = RTE_ETH_RSS_IP | (below(2) ? RTE_ETH_RSS_NONFRAG_IPV4_UDP : 0);
		fill(r->key, 40);
		r->rss.key = below(2) ? r->key : NULL;
		r->rss.key_len = r->rss.key ? 40 : 0;
		r->rss.queue_num = 1 + below(NB_RXQ);
		for (unsigned int q = 0; q < r->rss.queue_num; q++)
			r->queues[q] = below(NB_RXQ);
		r->rss.queue = r->queues;
		r->actions[a++].conf = &r->rss;
	}
	if (below(2)) {
		r->actions[a].type = RTE_FLOW_ACTION_TYPE_COUNT;
		r->actions[a++].conf = NULL;
	}
	r->actions[a].type = RTE_FLOW_ACTION_TYPE_END;

	if (below(2))
		return;
	switch (below(4)) {
	case 0:
		if (n > 0) {
			struct rte_flow_item *it = &r->items[below(n)];

			if (it->spec != NULL && below(2))
				fill((uint8_t *)it->mask, BLOB);
			else
				it->type = item_types[below(RTE_DIM(item_types))];
		}
		break;
	case 1:
		r->attr.priority = (uint32_t)rnd();
		r->attr.group = below(2);
		break;
	case 2:
		r->rss.func = below(5);
		r->rss.level = below(3);
		r->rss.key_len = below(BLOB + 1);
		r->rss.key = r->key;
		break;
	default:
		r->queue.index = below(NB_RXQ + 4);
		r->queues[0] = below(NB_RXQ + 4);
	}
}

static uint64_t seed_arg;

static int fail(const char *why, uint64_t iter, int rc)
{
	printf("flowfuzz: FAIL seed %" PRIu64 " iteration %" PRIu64 ": %s (rc %d, rte_errno %d)\n",
	       seed_arg, iter, why, rc, rte_errno);
	fflush(stdout);
	return 1;
}

/* A refusal as the API promises it: negative errno, rte_errno the same, an error with a type
 * and a message. */
static int refusal_ok(int rc, const struct rte_flow_error *e)
{
	return rc < 0 && rte_errno == -rc && e->type != RTE_FLOW_ERROR_TYPE_NONE &&
	       e->message != NULL && e->message[0] != '\0';
}

static int find_port(uint16_t *port)
{
	uint16_t p;

	RTE_ETH_FOREACH_DEV(p) {
		struct rte_eth_dev_info info;

		if (rte_eth_dev_info_get(p, &info) == 0 && strcmp(info.driver_name, DRIVER) == 0) {
			*port = p;
			return 1;
		}
	}
	return 0;
}

/* Creates distinct rules (destination UDP port i to queue 0) until the port refuses one or
 * `limit` are in; returns how many went in, and destroys them all. -1 on a destroy error. */
static int capacity(uint16_t port, int limit, struct rte_flow **flows)
{
	int n, i;

	for (n = 0; n < limit; n++) {
		struct rte_flow_attr attr = { .ingress = 1 };
		struct rte_flow_item_udp spec = { .hdr.dst_port = rte_cpu_to_be_16((uint16_t)n) };
		struct rte_flow_item_udp mask = { .hdr.dst_port = 0xffff };
		struct rte_flow_item items[] = {
			{ .type = RTE_FLOW_ITEM_TYPE_ETH },
			{ .type = RTE_FLOW_ITEM_TYPE_IPV4 },
			{ .type = RTE_FLOW_ITEM_TYPE_UDP, .spec = &spec, .mask = &mask },
			{ .type = RTE_FLOW_ITEM_TYPE_END },
		};
		struct rte_flow_action_queue q = { .index = 0 };
		struct rte_flow_action actions[] = {
			{ .type = RTE_FLOW_ACTION_TYPE_QUEUE, .conf = &q },
			{ .type = RTE_FLOW_ACTION_TYPE_END },
		};
		struct rte_flow_error err;

		flows[n] = rte_flow_create(port, &attr, items, actions, &err);
		if (flows[n] == NULL)
			break;
	}
	for (i = 0; i < n; i++) {
		struct rte_flow_error err;

		if (rte_flow_destroy(port, flows[i], &err) != 0)
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	static struct rule r;
	static struct rte_flow *cap_flows[8192];
	struct rte_flow *live[MAX_LIVE];
	struct rte_eth_conf conf = { 0 };
	struct rte_mempool *pool;
	uint64_t iters, it, created = 0, refused = 0, destroyed = 0, nlive = 0;
	int cap0, cap1, rc, q, msgs = 0;
	char seen[64][128];
	uint16_t port;

	rc = rte_eal_init(argc, argv);
	if (rc < 0)
		return 1;
	argc -= rc;
	argv += rc;
	if (argc != 3) {
		fprintf(stderr, "usage: flowfuzz <EAL args> -- <seed> <iterations>\n");
		return 2;
	}
	seed_arg = strtoull(argv[1], NULL, 0);
	iters = strtoull(argv[2], NULL, 0);
	rng = seed_arg * 0x9e3779b97f4a7c15ULL + 1;
	if (!find_port(&port))
		return fail("no " DRIVER " port", 0, 0);
	pool = rte_pktmbuf_pool_create("flowfuzz", 4095, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
				       rte_socket_id());
	if (pool == NULL)
		return fail("mbuf pool", 0, 0);
	if (rte_eth_dev_configure(port, NB_RXQ, 1, &conf) != 0)
		return fail("configure", 0, 0);
	for (q = 0; q < NB_RXQ; q++)
		if (rte_eth_rx_queue_setup(port, q, 256, rte_socket_id(), NULL, pool) != 0)
			return fail("rx queue setup", 0, 0);
	if (rte_eth_tx_queue_setup(port, 0, 256, rte_socket_id(), NULL) != 0)
		return fail("tx queue setup", 0, 0);
	if (rte_eth_dev_start(port) != 0)
		return fail("start", 0, 0);

	cap0 = capacity(port, (int)RTE_DIM(cap_flows), cap_flows);
	if (cap0 <= MAX_LIVE)
		return fail("the fresh port takes too few rules", 0, cap0);

	for (it = 0; it < iters; it++) {
		struct rte_flow_error ev, ec;
		struct rte_flow *f;
		int rv, ve, i;

		if (it == iters / 2) {
			/* Rules outlive a stop and start. */
			if (rte_eth_dev_stop(port) != 0 || rte_eth_dev_start(port) != 0)
				return fail("restart", it, 0);
		}
		if (below(2))
			plausible_rule(&r);
		else
			random_rule(&r);
		memset(&ev, 0x5a, sizeof(ev));
		memset(&ec, 0x5a, sizeof(ec));
		rte_errno = 0;
		rv = rte_flow_validate(port, &r.attr, r.items, r.actions, &ev);
		ve = rte_errno;
		if (rv != 0 && !refusal_ok(rv, &ev))
			return fail("validate refused without errno, type or message", it, rv);
		rte_errno = 0;
		f = rte_flow_create(port, &r.attr, r.items, r.actions, &ec);
		if ((f != NULL) != (rv == 0))
			return fail(f ? "created what validate refused" : "refused what validate accepted",
				    it, rv);
		if (f == NULL) {
			if (!refusal_ok(-rte_errno, &ec))
				return fail("create refused without errno, type or message", it,
					    -rte_errno);
			/* DPDK 22.11's rte_flow_validate itself refuses transfer with ingress or
			 * egress (EINVAL) before the driver sees the rule; rte_flow_create hands it
			 * to the driver. */
			if (rte_errno != ve && !(r.attr.transfer && (r.attr.ingress || r.attr.egress))) {
				printf("flowfuzz: validate: %d \"%s\"; create: %d \"%s\"\n", ve,
				       ev.message, rte_errno, ec.message);
				return fail("validate and create refused with different errno", it, ve);
			}
			refused++;
			for (i = 0; i < msgs && strncmp(seen[i], ec.message, 127) != 0; i++)
				;
			if (i == msgs && msgs < (int)RTE_DIM(seen)) {
				snprintf(seen[msgs++], sizeof(seen[0]), "%s", ec.message);
			}
			continue;
		}
		created++;
		if (nlive == MAX_LIVE || (nlive > 0 && below(3) == 0)) {
			uint64_t k = below((unsigned int)nlive);

			if (rte_flow_destroy(port, live[k], &ec) != 0)
				return fail("destroy", it, -rte_errno);
			destroyed++;
			live[k] = live[--nlive];
		}
		live[nlive++] = f;
	}
	while (nlive > 0) {
		struct rte_flow_error e;

		if (rte_flow_destroy(port, live[--nlive], &e) != 0)
			return fail("destroy at the end", iters, -rte_errno);
		destroyed++;
	}
	cap1 = capacity(port, (int)RTE_DIM(cap_flows), cap_flows);
	if (cap1 != cap0) {
		printf("flowfuzz: capacity %d at the start, %d at the end\n", cap0, cap1);
		return fail("rules leaked", iters, cap1);
	}
	if (rte_eth_dev_stop(port) != 0)
		return fail("stop", iters, 0);
	if (rte_eth_dev_close(port) != 0)
		return fail("close", iters, 0);
	for (q = 0; q < msgs; q++)
		printf("flowfuzz: refusal \"%s\"\n", seen[q]);
	printf("flowfuzz: PASS seed %" PRIu64 " iterations %" PRIu64 " created %" PRIu64
	       " refused %" PRIu64 " destroyed %" PRIu64 " capacity %d\n",
	       seed_arg, iters, created, refused, destroyed, cap0);
	fflush(stdout);
	rte_eal_cleanup();
	return 0;
}
