/*
 * Context fds, object import and MR re-registration through the C ABI, as
 * rdma-core documents them (ibv_import_device(3), ibv_import_pd(3),
 * ibv_rereg_mr(3)). Prints `key value...` lines; the test
 * (tests/tests/verbs_share.rs) compares them with what must hold.
 *
 * Usage (under `xroce run --iface IF`): verbs_share_probe DEVICE
 * Two RC QPs of one device are connected to each other over GID 1: QP A
 * on the opened context, QP B on a context imported from a dup of its
 * cmd_fd, with the imported PD; B's RDMA WRITEs read the imported MR.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LEN 4096
#define GID_INDEX 1

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &a);
}

/* RESET -> INIT -> RTR -> RTS towards `peer` on the same device. */
static int connect_qp(struct ibv_qp *qp, uint32_t peer, union ibv_gid gid, enum ibv_mtu mtu)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RESET;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return 1;
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = peer;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = GID_INDEX;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 3;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return 4;
	return 0;
}

/* One signalled RDMA WRITE of `len` bytes; returns the completion status
 * (or -1 if the post failed, -2 if nothing completed within 10 s). */
static int write_once(struct ibv_qp *qp, struct ibv_cq *cq, void *src, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 42;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		return -1;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n == 1)
			return wc.status;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (n < 0 || t.tv_sec - t0.tv_sec > 10)
			return -2;
	}
}

static void same_ino(const char *key, int a, int b)
{
	struct stat sa, sb;
	int ok = !fstat(a, &sa) && !fstat(b, &sb);
	printf("%s %d\n", key, ok && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

/* `ptr` NULL: 0 and errno; else 1. */
#define NULL_ERRNO(key, expr)                                                                  \
	do {                                                                                   \
		errno = 0;                                                                     \
		void *p_ = (void *)(expr);                                                     \
		printf("%s %d %d\n", key, p_ != NULL, p_ ? 0 : errno);                         \
	} while (0)

#define REREG(key, ...)                                                                        \
	do {                                                                                   \
		errno = 0;                                                                     \
		int r_ = ibv_rereg_mr(__VA_ARGS__);                                            \
		printf("%s %d %d\n", key, r_, r_ ? errno : 0);                                 \
	} while (0)

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: verbs_share_probe DEVICE\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	if (!dev) {
		fprintf(stderr, "no device %s\n", argv[1]);
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_context *other = ibv_open_device(dev);
	if (!ctx || !other)
		return 1;

	/* 1. cmd_fd and async_fd are real descriptors. */
	int cmd_dup = dup(ctx->cmd_fd);
	int async_dup = dup(ctx->async_fd);
	printf("dup_cmd_fd %d\n", cmd_dup >= 0);
	printf("dup_async_fd %d\n", async_dup >= 0);
	same_ino("cmd_dup_same_inode", ctx->cmd_fd, cmd_dup);
	same_ino("other_ctx_same_inode", ctx->cmd_fd, other->cmd_fd);
	struct pollfd pf[2] = { { .fd = ctx->cmd_fd, .events = POLLIN | POLLOUT },
				{ .fd = ctx->async_fd, .events = POLLIN } };
	int pn = poll(pf, 2, 0);
	printf("poll %d %d %d\n", pn, pf[0].revents == (POLLIN | POLLOUT), pf[1].revents);
	close(async_dup);

	/* 2. Import: foreign fds and handles first. */
	int pipefd[2];
	if (pipe(pipefd))
		return 1;
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	NULL_ERRNO("import_device_pipe", ibv_import_device(pipefd[0]));
	NULL_ERRNO("import_device_chardev", ibv_import_device(devnull));
	NULL_ERRNO("import_device_closed", ibv_import_device(1000));
	struct ibv_context *ictx = ibv_import_device(cmd_dup);
	printf("import_device %d\n", ictx != NULL);
	if (!ictx)
		return 1;
	printf("imported_fds %d %d\n", ictx->cmd_fd == cmd_dup, ictx->async_fd != ctx->async_fd);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq_a = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_cq *cq_b = ibv_create_cq(ictx, 8, NULL, NULL, 0);
	char *src = aligned_alloc(4096, LEN), *dst = aligned_alloc(4096, LEN),
	     *dst2 = aligned_alloc(4096, LEN);
	memset(dst, 0, LEN);
	memset(dst2, 0, LEN);
	for (int i = 0; i < LEN; i++)
		src[i] = (char)(i * 7 + 1);
	struct ibv_mr *mr_src = ibv_reg_mr(pd, src, LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr_dst =
		ibv_reg_mr(pd, dst, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!pd || !cq_a || !cq_b || !mr_src || !mr_dst)
		return 1;

	struct ibv_pd *other_pd = ibv_alloc_pd(other);
	NULL_ERRNO("import_pd_unknown", ibv_import_pd(ictx, 9999));
	NULL_ERRNO("import_pd_of_mr", ibv_import_pd(ictx, mr_src->handle));
	NULL_ERRNO("import_pd_other_ctx", ibv_import_pd(other, pd->handle + 100));
	struct ibv_pd *ipd = ibv_import_pd(ictx, pd->handle);
	printf("import_pd %d %d\n", ipd != NULL, ipd && ipd->handle == pd->handle);
	NULL_ERRNO("import_mr_of_pd", ibv_import_mr(ipd, pd->handle));
	struct ibv_mr *imr = ibv_import_mr(ipd, mr_src->handle);
	printf("import_mr %d\n", imr != NULL);
	if (!ipd || !imr)
		return 1;
	printf("imported_mr %d %d %d %d\n", imr->lkey == mr_src->lkey, imr->rkey == mr_src->rkey,
	       imr->length == LEN, imr->addr == NULL);

	/* QP A on the opened context, QP B on the imported one. */
	struct ibv_qp *qa = make_qp(pd, cq_a), *qb = make_qp(ipd, cq_b);
	union ibv_gid gid;
	struct ibv_port_attr port;
	if (!qa || !qb || ibv_query_gid(ctx, 1, GID_INDEX, &gid) || ibv_query_port(ctx, 1, &port))
		return 1;
	int ca = connect_qp(qa, qb->qp_num, gid, port.active_mtu);
	int cb = connect_qp(qb, qa->qp_num, gid, port.active_mtu);
	printf("connect %d %d\n", ca, cb);

	/* B writes from the imported MR into A's MR. */
	int st = write_once(qb, cq_b, src, imr->lkey, (uintptr_t)dst, mr_dst->rkey, LEN);
	printf("write_imported %d %d\n", st, !memcmp(src, dst, LEN));

	/* 3. Re-registration: rdma-core's input checks, then the provider's. */
	REREG("rereg_bad_flag", mr_dst, 8, NULL, NULL, 0, 0);
	REREG("rereg_translation_null", mr_dst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, LEN, 0);
	REREG("rereg_access_without_flag", mr_dst, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0,
	      IBV_ACCESS_LOCAL_WRITE);
	REREG("rereg_imported", imr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
	      IBV_ACCESS_LOCAL_WRITE);
	REREG("rereg_no_change", mr_dst, 0, NULL, NULL, 0, 0);
	REREG("rereg_remote_without_local", mr_dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
	      IBV_ACCESS_REMOTE_WRITE);
	REREG("rereg_odp", mr_dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
	      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	REREG("rereg_pd_of_other_ctx", mr_dst, IBV_REREG_MR_CHANGE_PD, other_pd, NULL, 0, 0);
	printf("after_failures %d\n", mr_dst->addr == dst && mr_dst->length == LEN);

	/* New translation: new keys; the new rkey reaches dst2. */
	uint32_t old_rkey = mr_dst->rkey, old_lkey = mr_dst->lkey;
	REREG("rereg_translation", mr_dst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, dst2, LEN, 0);
	printf("translated %d %d %d\n", mr_dst->rkey != old_rkey, mr_dst->lkey != old_lkey,
	       mr_dst->addr == dst2);
	st = write_once(qb, cq_b, src, imr->lkey, (uintptr_t)dst2, mr_dst->rkey, LEN);
	printf("write_new_key %d %d\n", st, !memcmp(src, dst2, LEN));
	/* The old key names nothing now (the QP goes to ERR). */
	st = write_once(qb, cq_b, src, imr->lkey, (uintptr_t)dst, old_rkey, 64);
	printf("write_old_key %d\n", st);

	/* New access keeps the keys: without remote write the key is refused,
	 * with it back the key is accepted again. */
	uint32_t rkey = mr_dst->rkey;
	REREG("rereg_local_only", mr_dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
	      IBV_ACCESS_LOCAL_WRITE);
	printf("access_keeps_keys %d\n", mr_dst->rkey == rkey);
	printf("reconnect %d %d\n", connect_qp(qa, qb->qp_num, gid, port.active_mtu),
	       connect_qp(qb, qa->qp_num, gid, port.active_mtu));
	st = write_once(qb, cq_b, src, imr->lkey, (uintptr_t)dst2, rkey, 64);
	printf("write_without_access %d\n", st);
	REREG("rereg_remote_again", mr_dst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
	      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	printf("reconnect_again %d %d\n", connect_qp(qa, qb->qp_num, gid, port.active_mtu),
	       connect_qp(qb, qa->qp_num, gid, port.active_mtu));
	memset(dst2, 0, LEN);
	st = write_once(qb, cq_b, src, imr->lkey, (uintptr_t)dst2, rkey, LEN);
	printf("write_with_access %d %d\n", st, !memcmp(src, dst2, LEN));

	/* Registration checks the memory as the kernel's pinning does: a
	 * read-only mapping takes a read-only MR only, a PROT_NONE one none
	 * (EFAULT), instead of a later remote WRITE crashing the program. */
	void *ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *none = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	NULL_ERRNO("reg_readonly_for_write",
		   ibv_reg_mr(pd, ro, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
	struct ibv_mr *ro_mr = ibv_reg_mr(pd, ro, 8192, IBV_ACCESS_REMOTE_READ);
	printf("reg_readonly_for_read %d\n", ro_mr != NULL);
	if (ro_mr)
		ibv_dereg_mr(ro_mr);
	NULL_ERRNO("reg_prot_none", ibv_reg_mr(pd, none, 8192, IBV_ACCESS_REMOTE_READ));
	munmap(ro, 8192);
	munmap(none, 8192);

	/* Teardown: the imported copies go first; closing the imported
	 * context closes the fd it took over. */
	ibv_destroy_qp(qb);
	ibv_destroy_qp(qa);
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd);
	printf("dereg %d %d\n", ibv_dereg_mr(mr_src), ibv_dereg_mr(mr_dst));
	ibv_destroy_cq(cq_b);
	ibv_destroy_cq(cq_a);
	printf("dealloc %d %d\n", ibv_dealloc_pd(pd), ibv_dealloc_pd(other_pd));
	printf("close_imported %d\n", ibv_close_device(ictx));
	errno = 0;
	int closed = fcntl(cmd_dup, F_GETFD);
	printf("dup_closed %d %d\n", closed, errno);
	printf("close %d %d\n", ibv_close_device(ctx), ibv_close_device(other));
	ibv_free_device_list(list);
	printf("done 1\n");
	return 0;
}
