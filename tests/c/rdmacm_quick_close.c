/* RDMA-CM connections that carry one message and are closed at once,
 * COUNT in a row, for tests/tests/rdmacm_programs.rs.
 *
 *   rdmacm_quick_close server answer|first|exit BIND_IP PORT COUNT
 *   rdmacm_quick_close client SERVER_IP PORT COUNT
 *
 * The client connects, SENDs one message, calls rdma_disconnect as soon
 * as the SEND completed, and waits for DISCONNECTED (printing how long
 * that took). The server accepts with a RECV posted and checks the
 * message; then, by its mode:
 *   answer: waits for DISCONNECTED (whether or not ESTABLISHED came
 *           first) and answers the DREQ with rdma_disconnect;
 *   first:  calls rdma_disconnect itself at once (the two DREQs cross),
 *           then waits for DISCONNECTED;
 *   exit:   exits (status 0) with the connection open, as a program that
 *           leaves the cleanup to process exit does (COUNT must be 1).
 * Both print one line per connection and exit 0 only if every connection
 * carried its message and ended with DISCONNECTED. A missing event ends
 * the program with exit 1 after EVENT_WAIT_MS, naming what it waited for. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define MSG_LEN 64
#define EVENT_WAIT_MS 30000

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void die(const char *what)
{
	fprintf(stderr, "FAILED: %s (errno %d %s)\n", what, errno, strerror(errno));
	exit(1);
}

/* The next event on the channel, or exit 1 naming what was awaited. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, const char *awaiting)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int n = poll(&p, 1, EVENT_WAIT_MS);
	if (n != 1) {
		fprintf(stderr, "FAILED: no event within %d ms while waiting for %s\n",
			EVENT_WAIT_MS, awaiting);
		exit(1);
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	return ev;
}

static void expect(struct rdma_cm_event *ev, enum rdma_cm_event_type want)
{
	if (ev->event != want || ev->status != 0) {
		fprintf(stderr, "FAILED: got %s (status %d), wanted %s\n",
			rdma_event_str(ev->event), ev->status, rdma_event_str(want));
		exit(1);
	}
}

/* Polls `cq` until one completion arrives (or EVENT_WAIT_MS pass). */
static void one_completion(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	long t0 = now_ms();
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			break;
		if (now_ms() - t0 > EVENT_WAIT_MS) {
			fprintf(stderr, "FAILED: no %s completion within %d ms\n", what, EVENT_WAIT_MS);
			exit(1);
		}
	}
	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "FAILED: %s completion status %s\n", what,
			ibv_wc_status_str(wc->status));
		exit(1);
	}
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = 2;
	qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 1;
	if (rdma_create_qp(id, NULL, &qa))
		die("rdma_create_qp");
}

static void fill(char *buf, int round)
{
	for (int i = 0; i < MSG_LEN; i++)
		buf[i] = (char)(round * 7 + i);
}

static struct sockaddr_storage address(const char *ip, const char *port)
{
	struct addrinfo hints, *res;
	struct sockaddr_storage ss;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	if (getaddrinfo(ip, port, &hints, &res)) {
		fprintf(stderr, "FAILED: bad address %s port %s\n", ip, port);
		exit(2);
	}
	memset(&ss, 0, sizeof(ss));
	memcpy(&ss, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return ss;
}

enum server_mode { ANSWER, FIRST, EXIT };

/* The RECV's completion must be the client's message of `round`. */
static void check_message(struct rdma_cm_id *id, const char *buf, int round)
{
	struct ibv_wc wc;
	one_completion(id->recv_cq, &wc, "RECV");
	char want[MSG_LEN];
	fill(want, round);
	if (wc.byte_len != MSG_LEN || memcmp(buf, want, MSG_LEN)) {
		fprintf(stderr, "FAILED: round %d: wrong message (%u bytes)\n", round, wc.byte_len);
		exit(1);
	}
}

/* Waits for DISCONNECTED; an ESTABLISHED before it is counted in
 * *established. */
static void await_disconnected(struct rdma_event_channel *ch, int round, int *established)
{
	for (;;) {
		struct rdma_cm_event *ev =
			next_event(ch, *established ? "DISCONNECTED" : "ESTABLISHED or DISCONNECTED");
		enum rdma_cm_event_type kind = ev->event;
		int status = ev->status;
		rdma_ack_cm_event(ev);
		if (kind == RDMA_CM_EVENT_ESTABLISHED && status == 0 && !*established) {
			*established = 1;
			continue;
		}
		if (kind == RDMA_CM_EVENT_DISCONNECTED && status == 0)
			return;
		fprintf(stderr, "FAILED: round %d: got %s (status %d)\n", round,
			rdma_event_str(kind), status);
		exit(1);
	}
}

static int server(enum server_mode mode, const char *ip, const char *port, int count)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listener;
	if (!ch || rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP))
		die("channel/id");
	struct sockaddr_storage ss = address(ip, port);
	if (rdma_bind_addr(listener, (struct sockaddr *)&ss) || rdma_listen(listener, 4))
		die("bind/listen");
	printf("listening\n");
	fflush(stdout);
	for (int round = 0; round < count; round++) {
		struct rdma_cm_event *ev = next_event(ch, "CONNECT_REQUEST");
		expect(ev, RDMA_CM_EVENT_CONNECT_REQUEST);
		struct rdma_cm_id *id = ev->id;
		rdma_ack_cm_event(ev);
		make_qp(id);
		char buf[MSG_LEN];
		struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			die("ibv_reg_mr");
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(id->qp, &wr, &bad))
			die("ibv_post_recv");
		struct rdma_conn_param param;
		memset(&param, 0, sizeof(param));
		param.responder_resources = 1;
		param.initiator_depth = 1;
		param.rnr_retry_count = 7;
		if (rdma_accept(id, &param))
			die("rdma_accept");
		int established = 0;
		switch (mode) {
		case ANSWER:
			/* The client's SEND completed before it disconnected:
			 * the message is here once DISCONNECTED is. */
			await_disconnected(ch, round, &established);
			check_message(id, buf, round);
			if (rdma_disconnect(id))
				die("rdma_disconnect");
			break;
		case FIRST:
			check_message(id, buf, round);
			if (rdma_disconnect(id))
				die("rdma_disconnect");
			await_disconnected(ch, round, &established);
			break;
		case EXIT:
			check_message(id, buf, round);
			printf("server round %d: %d bytes ok, exiting with the connection open\n",
			       round, MSG_LEN);
			fflush(stdout);
			exit(0);
		}
		printf("server round %d: %d bytes ok, %s, disconnected\n", round, MSG_LEN,
		       established ? "established" : "disconnected before established");
		fflush(stdout);
		rdma_destroy_qp(id);
		ibv_dereg_mr(mr);
		rdma_destroy_id(id);
	}
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	printf("server done\n");
	return 0;
}

static int client(const char *ip, const char *port, int count)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");
	struct sockaddr_storage dst = address(ip, port);
	for (int round = 0; round < count; round++) {
		struct rdma_cm_id *id;
		if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
			die("rdma_create_id");
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000))
			die("rdma_resolve_addr");
		struct rdma_cm_event *ev = next_event(ch, "ADDR_RESOLVED");
		expect(ev, RDMA_CM_EVENT_ADDR_RESOLVED);
		rdma_ack_cm_event(ev);
		if (rdma_resolve_route(id, 2000))
			die("rdma_resolve_route");
		ev = next_event(ch, "ROUTE_RESOLVED");
		expect(ev, RDMA_CM_EVENT_ROUTE_RESOLVED);
		rdma_ack_cm_event(ev);
		make_qp(id);
		char buf[MSG_LEN];
		fill(buf, round);
		struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof(buf), 0);
		if (!mr)
			die("ibv_reg_mr");
		struct rdma_conn_param param;
		memset(&param, 0, sizeof(param));
		param.responder_resources = 1;
		param.initiator_depth = 1;
		param.retry_count = 7;
		param.rnr_retry_count = 7;
		if (rdma_connect(id, &param))
			die("rdma_connect");
		ev = next_event(ch, "ESTABLISHED");
		expect(ev, RDMA_CM_EVENT_ESTABLISHED);
		rdma_ack_cm_event(ev);
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = mr->lkey };
		struct ibv_send_wr wr = {
			.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad;
		if (ibv_post_send(id->qp, &wr, &bad))
			die("ibv_post_send");
		struct ibv_wc wc;
		one_completion(id->send_cq, &wc, "SEND");
		/* At once, before the server did anything with it. */
		long t0 = now_ms();
		if (rdma_disconnect(id))
			die("rdma_disconnect");
		ev = next_event(ch, "DISCONNECTED");
		expect(ev, RDMA_CM_EVENT_DISCONNECTED);
		rdma_ack_cm_event(ev);
		printf("client round %d: sent %d bytes, disconnected in %ld ms\n", round, MSG_LEN,
		       now_ms() - t0);
		fflush(stdout);
		rdma_destroy_qp(id);
		ibv_dereg_mr(mr);
		rdma_destroy_id(id);
	}
	rdma_destroy_event_channel(ch);
	printf("client done\n");
	return 0;
}

static int usage(const char *self)
{
	fprintf(stderr, "usage: %s server answer|first|exit IP PORT COUNT\n"
			"       %s client IP PORT COUNT\n", self, self);
	return 2;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "client") && atoi(argv[4]) > 0)
		return client(argv[2], argv[3], atoi(argv[4]));
	if (argc != 6 || strcmp(argv[1], "server") || atoi(argv[5]) < 1)
		return usage(argv[0]);
	int count = atoi(argv[5]);
	if (!strcmp(argv[2], "answer"))
		return server(ANSWER, argv[3], argv[4], count);
	if (!strcmp(argv[2], "first"))
		return server(FIRST, argv[3], argv[4], count);
	if (!strcmp(argv[2], "exit") && count == 1)
		return server(EXIT, argv[3], argv[4], count);
	return usage(argv[0]);
}
