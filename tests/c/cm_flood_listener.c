/* A listener that is busy while a REQ flood arrives, and a client that
 * connects afterwards, for tests/tests/cm_flood.rs.
 *
 *   cm_flood_listener listen BIND_IP PORT BACKLOG GO_FILE
 *   cm_flood_listener connect SERVER_IP PORT
 *
 * listen: rdma_listen(id, BACKLOG) (0 or negative: the maximum, as ucma),
 * prints "listening rss_kb N", then fetches no event until GO_FILE exists
 * (a server busy elsewhere), prints "busy_done rss_kb N", rejects every
 * CONNECT_REQUEST already queued and prints "queued_requests N", then
 * accepts one connection ("established"), waits for DISCONNECTED
 * ("disconnected") and exits 0.
 * connect: connects, prints "connected", disconnects, waits for
 * DISCONNECTED and exits 0.
 * A missing event ends either with exit 1 after EVENT_WAIT_MS. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define EVENT_WAIT_MS 60000

static void die(const char *what)
{
	fprintf(stderr, "FAILED: %s (errno %d %s)\n", what, errno, strerror(errno));
	exit(1);
}

/* VmRSS of this process, in kB. */
static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	if (!f)
		die("open /proc/self/status");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, const char *awaiting)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	if (poll(&p, 1, EVENT_WAIT_MS) != 1) {
		fprintf(stderr, "FAILED: no event within %d ms while waiting for %s\n",
			EVENT_WAIT_MS, awaiting);
		exit(1);
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	return ev;
}

static struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = next_event(ch, rdma_event_str(want));
	if (ev->event != want || ev->status != 0) {
		fprintf(stderr, "FAILED: got %s (status %d), wanted %s\n",
			rdma_event_str(ev->event), ev->status, rdma_event_str(want));
		exit(1);
	}
	struct rdma_cm_id *id = ev->id;
	rdma_ack_cm_event(ev);
	return id;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	if (rdma_create_qp(id, NULL, &qa))
		die("rdma_create_qp");
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

/* Rejects every CONNECT_REQUEST the channel holds now; returns how many. */
static int reject_queued(struct rdma_event_channel *ch)
{
	int flags = fcntl(ch->fd, F_GETFL);
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK))
		die("fcntl O_NONBLOCK");
	int n = 0;
	for (;;) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev)) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			die("rdma_get_cm_event (non-blocking)");
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			fprintf(stderr, "FAILED: queued %s\n", rdma_event_str(ev->event));
			exit(1);
		}
		struct rdma_cm_id *id = ev->id;
		rdma_ack_cm_event(ev);
		if (rdma_reject(id, NULL, 0))
			die("rdma_reject");
		if (rdma_destroy_id(id))
			die("rdma_destroy_id");
		n++;
	}
	if (fcntl(ch->fd, F_SETFL, flags))
		die("fcntl");
	return n;
}

static int run_listener(char **argv)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id;
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	struct sockaddr_storage ss = address(argv[2], argv[3]);
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&ss))
		die("rdma_bind_addr");
	if (rdma_listen(listen_id, atoi(argv[4])))
		die("rdma_listen");
	printf("listening rss_kb %ld\n", rss_kb());
	fflush(stdout);
	/* Busy: no event is fetched until the test says so. */
	for (int waited = 0; access(argv[5], F_OK) != 0; waited += 10) {
		if (waited > EVENT_WAIT_MS * 2) {
			fprintf(stderr, "FAILED: %s never appeared\n", argv[5]);
			exit(1);
		}
		usleep(10000);
	}
	printf("busy_done rss_kb %ld\n", rss_kb());
	printf("queued_requests %d\n", reject_queued(ch));
	fflush(stdout);

	struct rdma_cm_id *id = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	make_qp(id);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	if (rdma_accept(id, &cp))
		die("rdma_accept");
	expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	printf("established\n");
	fflush(stdout);
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_disconnect(id);
	printf("disconnected\n");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return 0;
}

static int run_client(char **argv)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	struct sockaddr_storage ss = address(argv[2], argv[3]);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, 2000))
		die("rdma_resolve_addr");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	make_qp(id);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.retry_count = 7;
	if (rdma_connect(id, &cp))
		die("rdma_connect");
	expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	printf("connected\n");
	fflush(stdout);
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 6 && !strcmp(argv[1], "listen"))
		return run_listener(argv);
	if (argc == 4 && !strcmp(argv[1], "connect"))
		return run_client(argv);
	fprintf(stderr, "usage: %s listen BIND_IP PORT BACKLOG GO_FILE | connect SERVER_IP PORT\n",
		argv[0]);
	return 2;
}
