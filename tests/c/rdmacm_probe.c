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

/* Loopback: the events of two ids on one channel, in whatever order
 * they come; each expected (event, id) is counted once. */
struct expected_event {
	enum rdma_cm_event_type event;
	struct rdma_cm_id *id; /* NULL: any id (a new one for CONNECT_REQUEST) */
	struct rdma_cm_id *got;
	int seen;
};

static int await_events(struct rdma_event_channel *ch, struct expected_event *want, int n)
{
	int left = n;
	while (left > 0) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1)
			return 0;
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev))
			return 0;
		int matched = 0;
		for (int i = 0; i < n && !matched; i++) {
			if (want[i].seen || want[i].event != ev->event || ev->status != 0)
				continue;
			if (want[i].id && want[i].id != ev->id)
				continue;
			want[i].seen = 1;
			want[i].got = ev->id;
			matched = 1;
			left--;
		}
		if (!matched)
			printf("loop_unexpected %s %d\n", rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
		if (!matched)
			return 0;
	}
	return 1;
}

static struct ibv_qp_init_attr rc_attr(void)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = 2;
	qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	return qa;
}

/* Loopback and wildcard addresses, as the kernel's rdma_cm treats them
 * (cma_any_addr): a bind attaches no device; a resolution goes to the
 * first active device, source and destination its own GID; a connection
 * to 127.0.0.1 carries data within the process. */
static void loopback(struct rdma_event_channel *ch, const char *local)
{
	struct rdma_cm_id *lo, *lo6, *any;
	struct rdma_cm_event *ev;
	struct sockaddr_in lo_addr = ipv4("127.0.0.1", 0);
	rdma_create_id(ch, &lo, NULL, RDMA_PS_TCP);
	out_err("bind_lo", rdma_bind_addr(lo, (struct sockaddr *)&lo_addr));
	out("bind_lo_port_nonzero", rdma_get_src_port(lo) != 0);
	out("bind_lo_verbs_null", lo->verbs == NULL);
	struct sockaddr_in6 lo6_addr;
	memset(&lo6_addr, 0, sizeof(lo6_addr));
	lo6_addr.sin6_family = AF_INET6;
	lo6_addr.sin6_addr = in6addr_loopback;
	rdma_create_id(ch, &lo6, NULL, RDMA_PS_TCP);
	out_err("bind_lo6", rdma_bind_addr(lo6, (struct sockaddr *)&lo6_addr));
	rdma_destroy_id(lo6);
	/* A destination of the other family is EINVAL, loopback or not. */
	struct sockaddr_in6 dst6_lo = lo6_addr;
	dst6_lo.sin6_port = htons(7480);
	out_err("resolve_lo_other_family",
		rdma_resolve_addr(lo, NULL, (struct sockaddr *)&dst6_lo, 2000));
	/* A loopback binding holds its port against the other addresses. */
	struct sockaddr_in same_port = ipv4(local, ntohs(rdma_get_src_port(lo)));
	rdma_create_id(ch, &any, NULL, RDMA_PS_TCP);
	out_err("bind_lo_port_taken", rdma_bind_addr(any, (struct sockaddr *)&same_port));
	rdma_destroy_id(any);
	rdma_destroy_id(lo);

	/* libfabric's verbs provider: "localhost", passive, as an endpoint. */
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_family = AF_INET;
	out_err("gai_localhost", rdma_getaddrinfo("localhost", NULL, &hints, &res));
	struct rdma_cm_id *ep = NULL;
	out_err("ep_localhost", rdma_create_ep(&ep, res, NULL, NULL));
	if (ep) {
		out("ep_localhost_verbs_null", ep->verbs == NULL);
		rdma_destroy_ep(ep);
	}
	rdma_freeaddrinfo(res);

	/* Resolving 127.0.0.1, 0.0.0.0 and ::1 from unbound ids, and
	 * 127.0.0.1 from an id bound to the local address. */
	const char *dsts[] = { "127.0.0.1", "0.0.0.0", "::1", "bound" };
	const char *keys[] = { "lo", "any", "lo6", "lo_bound" };
	for (int i = 0; i < 4; i++) {
		struct rdma_cm_id *id;
		struct sockaddr_storage dst;
		char k[64];
		memset(&dst, 0, sizeof(dst));
		rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
		if (!strcmp(dsts[i], "::1")) {
			struct sockaddr_in6 *d6 = (struct sockaddr_in6 *)&dst;
			d6->sin6_family = AF_INET6;
			d6->sin6_addr = in6addr_loopback;
			d6->sin6_port = htons(7480);
		} else {
			*(struct sockaddr_in *)&dst = ipv4(!strcmp(dsts[i], "bound") ? "127.0.0.1" : dsts[i], 7480);
		}
		if (!strcmp(dsts[i], "bound")) {
			struct sockaddr_in src = ipv4(local, 0);
			rdma_bind_addr(id, (struct sockaddr *)&src);
		}
		snprintf(k, sizeof(k), "resolve_%s", keys[i]);
		out_err(k, rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000));
		snprintf(k, sizeof(k), "%s_event", keys[i]);
		ev = next_event(ch, k);
		rdma_ack_cm_event(ev);
		if (id->verbs) {
			snprintf(k, sizeof(k), "%s_device", keys[i]);
			printf("%s %s\n", k, ibv_get_device_name(id->verbs->device));
		}
		char text[64];
		struct sockaddr *la = rdma_get_local_addr(id);
		inet_ntop(la->sa_family,
			  la->sa_family == AF_INET ? (void *)&((struct sockaddr_in *)la)->sin_addr
						   : (void *)&((struct sockaddr_in6 *)la)->sin6_addr,
			  text, sizeof(text));
		printf("%s_local_addr %s\n", keys[i], text);
		snprintf(k, sizeof(k), "%s_sgid", keys[i]);
		out_gid(k, &id->route.addr.addr.ibaddr.sgid);
		snprintf(k, sizeof(k), "%s_dgid", keys[i]);
		out_gid(k, &id->route.addr.addr.ibaddr.dgid);
		snprintf(k, sizeof(k), "resolve_%s_route", keys[i]);
		out_err(k, rdma_resolve_route(id, 2000));
		snprintf(k, sizeof(k), "%s_route", keys[i]);
		ev = next_event(ch, k);
		rdma_ack_cm_event(ev);
		rdma_destroy_id(id);
	}

	/* A connection to 127.0.0.1 within the process: a listener on the
	 * wildcard, a client, one SEND, a disconnect on both sides. */
	struct rdma_cm_id *listener, *client, *server = NULL;
	struct sockaddr_in any_addr = ipv4("0.0.0.0", 7481), dst = ipv4("127.0.0.1", 7481);
	rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP);
	rdma_bind_addr(listener, (struct sockaddr *)&any_addr);
	out_err("loop_listen", rdma_listen(listener, 1));
	rdma_create_id(ch, &client, NULL, RDMA_PS_TCP);
	rdma_resolve_addr(client, NULL, (struct sockaddr *)&dst, 2000);
	rdma_ack_cm_event(next_event(ch, "loop_addr_event"));
	rdma_resolve_route(client, 2000);
	rdma_ack_cm_event(next_event(ch, "loop_route_event"));
	struct ibv_qp_init_attr qa = rc_attr();
	out_err("loop_client_qp", rdma_create_qp(client, NULL, &qa));
	struct rdma_conn_param param;
	memset(&param, 0, sizeof(param));
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	out_err("loop_connect", rdma_connect(client, &param));
	struct expected_event req[] = { { RDMA_CM_EVENT_CONNECT_REQUEST, NULL } };
	out("loop_request", await_events(ch, req, 1));
	server = req[0].got;
	if (!server)
		return;
	char rbuf[32], sbuf[32] = "xroce loopback";
	qa = rc_attr();
	out_err("loop_server_qp", rdma_create_qp(server, NULL, &qa));
	struct ibv_mr *rmr = ibv_reg_mr(server->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(client->pd, sbuf, sizeof(sbuf), 0);
	struct ibv_sge rsge = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &rsge, .num_sge = 1 }, *rbad;
	ibv_post_recv(server->qp, &rwr, &rbad);
	out_err("loop_accept", rdma_accept(server, &param));
	struct expected_event est[] = {
		{ RDMA_CM_EVENT_ESTABLISHED, client },
		{ RDMA_CM_EVENT_ESTABLISHED, server },
	};
	out("loop_established", await_events(ch, est, 2));
	struct ibv_sge ssge = { .addr = (uintptr_t)sbuf, .length = sizeof(sbuf), .lkey = smr->lkey };
	struct ibv_send_wr swr = {
		.sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *sbad;
	ibv_post_send(client->qp, &swr, &sbad);
	struct ibv_wc wc;
	int polled = 0;
	long t0 = now_ms();
	while (polled == 0 && now_ms() - t0 < 5000)
		polled = ibv_poll_cq(client->send_cq, 1, &wc);
	out("loop_send_ok", polled == 1 && wc.status == IBV_WC_SUCCESS);
	polled = 0;
	while (polled == 0 && now_ms() - t0 < 5000)
		polled = ibv_poll_cq(server->recv_cq, 1, &wc);
	out("loop_recv_ok", polled == 1 && wc.status == IBV_WC_SUCCESS &&
		wc.byte_len == sizeof(sbuf) && !memcmp(rbuf, sbuf, sizeof(sbuf)));
	out_err("loop_disconnect", rdma_disconnect(client));
	struct expected_event dreq[] = { { RDMA_CM_EVENT_DISCONNECTED, server } };
	out("loop_server_disconnected", await_events(ch, dreq, 1));
	out_err("loop_server_disconnect", rdma_disconnect(server));
	struct expected_event drep[] = { { RDMA_CM_EVENT_DISCONNECTED, client } };
	out("loop_client_disconnected", await_events(ch, drep, 1));
	rdma_destroy_qp(client);
	rdma_destroy_qp(server);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);
	out_err("loop_destroy", rdma_destroy_id(server) | rdma_destroy_id(client) |
					rdma_destroy_id(listener));
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

	loopback(ch, local);

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
