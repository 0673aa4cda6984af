/* Drives xroce's librdmacm.so.1 the way RDMA-CM programs do and prints one
 * "key value" line per fact for tests/tests/rdmacm_abi.rs to check.
 * Usage: rdmacm_probe LOCAL_IP PEER_IP UNREACHABLE_IP [LOCAL_IP6 PEER_IP6] */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

static void out(const char *key, long value)
{
	printf("%s %ld\n", key, value);
	fflush(stdout);
}

/* rc and errno of a call that must fail: "KEY -1 ERRNO". */
static void out_err(const char *key, int rc)
{
	printf("%s %d %d\n", key, rc, rc ? errno : 0);
	fflush(stdout);
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct sockaddr_in ipv4(const char *ip, unsigned short port)
{
	struct sockaddr_in sin;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	inet_pton(AF_INET, ip, &sin.sin_addr);
	return sin;
}

static void out_gid(const char *key, const union ibv_gid *gid)
{
	printf("%s ", key);
	for (int i = 0; i < 16; i++)
		printf("%02x", gid->raw[i]);
	printf("\n");
}

struct delayed_ack {
	struct rdma_cm_event *event;
	int ms;
};

static void *ack_later(void *arg)
{
	struct delayed_ack *d = arg;
	usleep(d->ms * 1000);
	rdma_ack_cm_event(d->event);
	return NULL;
}

/* Waits for the next event (poll on the fd first) and prints it. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, const char *key)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	char k[64];
	snprintf(k, sizeof(k), "%s_poll", key);
	out(k, poll(&p, 1, 5000) == 1 && (p.revents & POLLIN));
	struct rdma_cm_event *ev = NULL;
	if (rdma_get_cm_event(ch, &ev)) {
		snprintf(k, sizeof(k), "%s_get_errno", key);
		out(k, errno);
		exit(1);
	}
	printf("%s %s %d\n", key, rdma_event_str(ev->event), ev->status);
	fflush(stdout);
	return ev;
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 6) {
		fprintf(stderr, "usage: %s LOCAL_IP PEER_IP UNREACHABLE_IP [LOCAL_IP6 PEER_IP6]\n",
			argv[0]);
		return 2;
	}
	const char *local = argv[1], *peer = argv[2], *unreachable = argv[3];
	struct rdma_cm_event *ev;

	/* Devices. */
	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	out("devices", n);
	if (devs && devs[0])
		printf("device0 %s\n", ibv_get_device_name(devs[0]->device));
	rdma_free_devices(devs);

	/* Channel: empty, non-blocking. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	out("channel", ch != NULL);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	out_err("get_empty", rdma_get_cm_event(ch, &ev));
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	out("poll_empty", poll(&p, 1, 0));
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK);

	/* Ids and binding. */
	struct rdma_cm_id *id, *other, *udp;
	out_err("create_id", rdma_create_id(ch, &id, (void *)0x1234, RDMA_PS_TCP));
	out("id_context", id->context == (void *)0x1234);
	out("id_qp_type", id->qp_type);
	out_err("create_id_bad_ps", rdma_create_id(ch, &other, NULL, 0x42));
	struct sockaddr_in sin = ipv4(local, 0);
	out_err("bind", rdma_bind_addr(id, (struct sockaddr *)&sin));
	unsigned short port = ntohs(rdma_get_src_port(id));
	out("src_port", port);
	out("bound_port_num", id->port_num);
	if (id->verbs)
		printf("bound_device %s\n", ibv_get_device_name(id->verbs->device));
	out_err("bind_again", rdma_bind_addr(id, (struct sockaddr *)&sin));
	rdma_create_id(ch, &other, NULL, RDMA_PS_TCP);
	sin.sin_port = htons(port);
	out_err("bind_in_use", rdma_bind_addr(other, (struct sockaddr *)&sin));
	rdma_create_id(ch, &udp, NULL, RDMA_PS_UDP);
	out("udp_qp_type", udp->qp_type);
	out_err("bind_other_ps", rdma_bind_addr(udp, (struct sockaddr *)&sin));
	rdma_destroy_id(udp);
	struct sockaddr_in foreign = ipv4("192.0.2.77", 0);
	out_err("bind_foreign", rdma_bind_addr(other, (struct sockaddr *)&foreign));
	struct sockaddr_in6 any6;
	memset(&any6, 0, sizeof(any6));
	any6.sin6_family = AF_INET6;
	out_err("bind_any6", rdma_bind_addr(other, (struct sockaddr *)&any6));
	out("any6_port_nonzero", rdma_get_src_port(other) != 0);
	rdma_destroy_id(other);

	/* Options. */
	unsigned char tos = 32;
	int one = 1;
	out_err("opt_tos", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1));
	out_err("opt_tos_len", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4));
	out_err("opt_reuse_bound", rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)));
	out_err("opt_unknown", rdma_set_option(id, RDMA_OPTION_ID, 77, &one, sizeof(one)));
	out_err("opt_level", rdma_set_option(id, 9, 0, &one, sizeof(one)));

	/* Address and route to the peer. */
	out_err("resolve_route_early", rdma_resolve_route(id, 1000));
	struct sockaddr_in dst = ipv4(peer, 7471);
	out_err("resolve_addr", rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
	ev = next_event(ch, "addr_event");
	out("addr_event_id", ev->id == id);
	out("addr_event_context", ev->id->context == (void *)0x1234);
	rdma_ack_cm_event(ev);
	out("dst_port", ntohs(rdma_get_dst_port(id)));
	out("src_port_kept", ntohs(rdma_get_src_port(id)) == port);
	char text[64];
	inet_ntop(AF_INET, &((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr, text, sizeof(text));
	printf("local_addr %s\n", text);
	inet_ntop(AF_INET, &((struct sockaddr_in *)rdma_get_peer_addr(id))->sin_addr, text, sizeof(text));
	printf("peer_addr %s\n", text);
	out_err("resolve_route", rdma_resolve_route(id, 2000));
	ev = next_event(ch, "route_event");
	rdma_ack_cm_event(ev);
	out("num_paths", id->route.num_paths);
	out_gid("sgid", &id->route.addr.addr.ibaddr.sgid);
	out_gid("dgid", &id->route.addr.addr.ibaddr.dgid);
	if (id->route.path_rec) {
		out_gid("path_sgid", &id->route.path_rec->sgid);
		out_gid("path_dgid", &id->route.path_rec->dgid);
		out("path_mtu", id->route.path_rec->mtu);
		out("path_pkey", ntohs(id->route.path_rec->pkey));
		out("path_tclass", id->route.path_rec->traffic_class);
	}
	struct ibv_port_attr port_attr;
	ibv_query_port(id->verbs, id->port_num, &port_attr);
	out("port_active_mtu", port_attr.active_mtu);

	/* A QP on the id: default PD, CQs made by the library, INIT. */
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	out_err("create_qp", rdma_create_qp(id, NULL, &qa));
	out("own_cqs", id->qp && id->send_cq && id->recv_cq && id->send_cq_channel);
	out("cqs_written_back", qa.send_cq == id->send_cq && qa.recv_cq == id->recv_cq);
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if (id->qp && ibv_query_qp(id->qp, &qattr, IBV_QP_STATE | IBV_QP_PORT, &qinit) == 0) {
		out("qp_state", qattr.qp_state);
		out("qp_port", qattr.port_num);
	}
	out_err("create_qp_twice", rdma_create_qp(id, NULL, &qa));
	rdma_destroy_qp(id);
	out("qp_gone", id->qp == NULL && id->send_cq == NULL);

	/* An SRQ on the id, on the default PD. */
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 8;
	sa.attr.max_sge = 1;
	out_err("create_srq", rdma_create_srq(id, NULL, &sa));
	out("srq_max_wr_ok", sa.attr.max_wr >= 8);
	out("srq_has_pd", id->srq && id->srq->pd != NULL);
	rdma_destroy_srq(id);
	out("srq_gone", id->srq == NULL);

	/* Wrong uses as rdma-core answers them: listening on an id whose
	 * route is resolved, connecting without a QP or parameters. */
	out_err("listen", rdma_listen(id, 1));
	out_err("connect", rdma_connect(id, NULL));

	/* An address that does not answer ARP: ADDR_ERROR after the timeout. */
	struct rdma_cm_id *lost;
	rdma_create_id(ch, &lost, NULL, RDMA_PS_TCP);
	struct sockaddr_in nowhere = ipv4(unreachable, 7471);
	long t0 = now_ms();
	out_err("resolve_unreachable", rdma_resolve_addr(lost, NULL, (struct sockaddr *)&nowhere, 700));
	ev = next_event(ch, "unreachable_event");
	out("unreachable_ms", now_ms() - t0);
	rdma_ack_cm_event(ev);
	/* No route at all: the call itself fails. */
	struct sockaddr_in unroutable = ipv4("198.51.100.1", 7471);
	out_err("resolve_unroutable", rdma_resolve_addr(lost, NULL, (struct sockaddr *)&unroutable, 700));

	/* A synchronous id: calls return once their event arrived. */
	struct rdma_cm_id *sync;
	out_err("create_sync", rdma_create_id(NULL, &sync, NULL, RDMA_PS_TCP));
	out("sync_has_channel", sync->channel != NULL);
	out_err("sync_resolve_addr", rdma_resolve_addr(sync, NULL, (struct sockaddr *)&dst, 2000));
	out("sync_event", sync->event ? (long)sync->event->event : -1);
	out_err("sync_resolve_route", rdma_resolve_route(sync, 2000));
	out("sync_route_event", sync->event ? (long)sync->event->event : -1);
	/* Migrate it onto the shared channel: asynchronous from then on. */
	out_err("migrate", rdma_migrate_id(sync, ch));
	out("migrated_channel", sync->channel == ch);
	out_err("destroy_sync", rdma_destroy_id(sync));
	struct rdma_cm_id *sync_lost;
	rdma_create_id(NULL, &sync_lost, NULL, RDMA_PS_TCP);
	out_err("sync_unreachable", rdma_resolve_addr(sync_lost, NULL, (struct sockaddr *)&nowhere, 300));
	rdma_destroy_id(sync_lost);

	/* A UD QP on a UDP id: ready to send (RTS) with rdma_cm's Q_Key. */
	struct rdma_cm_id *ud;
	rdma_create_id(NULL, &ud, NULL, RDMA_PS_UDP);
	out_err("ud_resolve_addr", rdma_resolve_addr(ud, NULL, (struct sockaddr *)&dst, 2000));
	/* rdma_create_qp wrote the id's CQs (since destroyed) into qa, as
	 * rdma-core does: start from fresh attributes. */
	struct ibv_qp_init_attr uda = qa;
	uda.send_cq = uda.recv_cq = NULL;
	uda.qp_type = IBV_QPT_UD;
	out_err("ud_create_qp", rdma_create_qp(ud, NULL, &uda));
	if (ud->qp && ibv_query_qp(ud->qp, &qattr, IBV_QP_STATE | IBV_QP_QKEY, &qinit) == 0) {
		out("ud_qp_state", qattr.qp_state);
		out("ud_qkey", qattr.qkey);
	}
	rdma_destroy_qp(ud);
	rdma_destroy_id(ud);

	/* rdma_getaddrinfo. */
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST;
	out_err("getaddrinfo", rdma_getaddrinfo(peer, "7471", &hints, &res));
	out("gai_port_space", res->ai_port_space);
	out("gai_qp_type", res->ai_qp_type);
	out("gai_family", res->ai_family);
	out("gai_dst_port", ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port));
	out("gai_src_null", res->ai_src_addr == NULL);
	rdma_freeaddrinfo(res);
	hints.ai_flags = RAI_PASSIVE;
	out_err("getaddrinfo_passive", rdma_getaddrinfo(NULL, "7472", &hints, &res));
	out("gai_passive_port", ntohs(((struct sockaddr_in *)res->ai_src_addr)->sin_port));
	out("gai_passive_dst_null", res->ai_dst_addr == NULL);
	rdma_freeaddrinfo(res);
	/* An endpoint from it: bound, synchronous. */
	hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	rdma_getaddrinfo(local, "7473", &hints, &res);
	struct rdma_cm_id *ep;
	out_err("create_ep_passive", rdma_create_ep(&ep, res, NULL, NULL));
	out("ep_port", ntohs(rdma_get_src_port(ep)));
	rdma_destroy_ep(ep);
	rdma_freeaddrinfo(res);
	hints.ai_flags = RAI_NUMERICHOST;
	rdma_getaddrinfo(peer, "7474", &hints, &res);
	qa.send_cq = qa.recv_cq = NULL;
	out_err("create_ep_active", rdma_create_ep(&ep, res, NULL, &qa));
	out("ep_qp", ep->qp != NULL);
	rdma_destroy_ep(ep);
	rdma_freeaddrinfo(res);

	/* IPv6: the same through the IPv6 route, GIDs the addresses themselves. */
	if (argc == 6) {
		struct rdma_cm_id *id6;
		struct sockaddr_in6 src6, dst6;
		memset(&src6, 0, sizeof(src6));
		memset(&dst6, 0, sizeof(dst6));
		src6.sin6_family = dst6.sin6_family = AF_INET6;
		inet_pton(AF_INET6, argv[4], &src6.sin6_addr);
		inet_pton(AF_INET6, argv[5], &dst6.sin6_addr);
		dst6.sin6_port = htons(7475);
		rdma_create_id(ch, &id6, NULL, RDMA_PS_TCP);
		out_err("bind6", rdma_bind_addr(id6, (struct sockaddr *)&src6));
		out_err("resolve_addr6", rdma_resolve_addr(id6, NULL, (struct sockaddr *)&dst6, 2000));
		ev = next_event(ch, "addr6_event");
		rdma_ack_cm_event(ev);
		out_err("resolve_route6", rdma_resolve_route(id6, 2000));
		ev = next_event(ch, "route6_event");
		rdma_ack_cm_event(ev);
		out_gid("sgid6", &id6->route.addr.addr.ibaddr.sgid);
		out_gid("dgid6", &id6->route.addr.addr.ibaddr.dgid);
		out("dst6_port", ntohs(rdma_get_dst_port(id6)));
		out_err("destroy6", rdma_destroy_id(id6));
	}

	/* Destroy waits until the program acked the events it took. */
	struct rdma_cm_id *held;
	rdma_create_id(ch, &held, NULL, RDMA_PS_TCP);
	rdma_resolve_addr(held, NULL, (struct sockaddr *)&dst, 2000);
	ev = next_event(ch, "held_event");
	struct delayed_ack d = { .event = ev, .ms = 300 };
	pthread_t t;
	pthread_create(&t, NULL, ack_later, &d);
	t0 = now_ms();
	out_err("destroy_held", rdma_destroy_id(held));
	out("destroy_waited_ms", now_ms() - t0);
	pthread_join(t, NULL);

	out_err("destroy_lost", rdma_destroy_id(lost));
	out_err("destroy_id", rdma_destroy_id(id));
	rdma_destroy_event_channel(ch);
	out("done", 1);
	return 0;
}
