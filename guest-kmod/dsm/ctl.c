// SPDX-License-Identifier: GPL-2.0
/*
 * dsm control: /dev/dsm_ctl takes one text command per write() and read()
 * returns its result; the harness drives it through the guest's shell.
 * Applications use /dev/dsm (region.c, sync.c).
 *
 * Commands: open DEV SELF NODES [PAGES] | connect PEER lid= qpn= psn= rkey= gid= |
 *   config handler=irq|process|user-sim readfault=write|read | selftest MSGS SIZE |
 *   defer N | stats | state | close | devices
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/inet.h>
#include "dsm.h"
#include "region.h"
#include "ctldev.h"

static int dsm_cmd_run(char *cmd, char *args);

/* Its lock serialises commands, the device list, and set-up/tear-down of comm. */
static struct ctldev dsm_ctl = { .run = dsm_cmd_run };
static struct dsm_comm *comm;

#define DSM_DEFAULT_PAGES	2048

int dsm_dispatch(struct dsm_comm *c, u32 peer, void *msg, u32 len, bool in_irq)
{
	const struct dsm_msg_hdr *h = msg;

	if (len >= sizeof(*h) && le16_to_cpu(h->type) >= DSM_PROTO_TYPE_MIN)
		return dsm_proto_handle(c, peer, msg, len, in_irq);
	return dsm_selftest_handle(c, peer, msg, len, in_irq);
}

static int dsm_session_close(void)
{
	return dsm_close(comm, false);
}

static int dsm_cmd_open(char *args)
{
	char name[IB_DEVICE_NAME_MAX];
	u32 self, nodes, pages = DSM_DEFAULT_PAGES;
	struct ib_device *dev;
	int err;

	if (sscanf(args, "%63s %u %u %u", name, &self, &nodes, &pages) < 3)
		return -EINVAL;
	dev = ctldev_find(&dsm_ctl, name);
	if (!dev)
		return -ENODEV;
	err = dsm_session_close();
	if (err)
		return err;
	comm->handle = dsm_dispatch;
	comm->peer_lost = dsm_proto_peer_lost;
	err = dsm_comm_open(comm, dev, self, nodes);
	if (!err)
		err = dsm_proto_open(comm, pages);
	if (err) {
		dsm_close(comm, true);
		return err;
	}
	return dsm_comm_addr(comm, dsm_ctl.result, sizeof(dsm_ctl.result));
}

static int dsm_cmd_connect(char *args)
{
	u32 peer, lid = 0, qpn = 0, psn = 0, rkey = 0, seen = 0;
	union ib_gid gid = {};
	char *tok, *val;

	tok = strsep(&args, " ");
	if (!tok || kstrtou32(tok, 0, &peer))
		return -EINVAL;
	while (args && (tok = strsep(&args, " ")) != NULL) {
		val = strchr(tok, '=');
		if (!val)
			continue;
		*val++ = '\0';
		if (!strcmp(tok, "lid") && !kstrtou32(val, 0, &lid))
			seen |= 1;
		else if (!strcmp(tok, "qpn") && !kstrtou32(val, 0, &qpn))
			seen |= 2;
		else if (!strcmp(tok, "psn") && !kstrtou32(val, 0, &psn))
			seen |= 4;
		else if (!strcmp(tok, "gid") && in6_pton(val, -1, gid.raw, -1, NULL))
			seen |= 8;
		else if (!strcmp(tok, "rkey") && !kstrtou32(val, 0, &rkey))
			seen |= 16;
	}
	if (seen != 31 || !comm->dev)
		return -EINVAL;
	return dsm_comm_connect(comm, peer, lid, qpn, psn, rkey, &gid);
}

static int dsm_cmd_config(char *args)
{
	char handler[16], readfault[16];
	enum dsm_mode mode;

	if (!comm->proto ||
	    sscanf(args, "handler=%15s readfault=%15s", handler, readfault) != 2)
		return -EINVAL;
	if (!strcmp(handler, "irq"))
		mode = DSM_MODE_IRQ;
	else if (!strcmp(handler, "process"))
		mode = DSM_MODE_TASK_QUEUE;
	else if (!strcmp(handler, "user-sim"))
		mode = DSM_MODE_USER_SIM;
	else
		return -EINVAL;
	if (strcmp(readfault, "write") && strcmp(readfault, "read"))
		return -EINVAL;
	return dsm_proto_config(comm->proto, mode, !strcmp(readfault, "read"));
}

static int dsm_cmd_stats(void)
{
	struct dsm_stats *s = &comm->stats;

	if (comm->proto)
		return dsm_proto_stats(comm->proto, dsm_ctl.result,
				       sizeof(dsm_ctl.result));
	return scnprintf(dsm_ctl.result, sizeof(dsm_ctl.result),
			 "sent=%lld received=%lld deferred=%lld send_busy=%lld cqe_errors=%lld\n",
			 atomic64_read(&s->sent), atomic64_read(&s->received),
			 atomic64_read(&s->deferred), atomic64_read(&s->send_busy),
			 atomic64_read(&s->cqe_errors));
}

/* What the session waits on and holds, when an application hangs. */
static int dsm_cmd_state(void)
{
	int n;

	if (comm->proto) {
		dsm_proto_state(comm->proto, dsm_ctl.result, sizeof(dsm_ctl.result));
		return 0;
	}
	if (!comm->nodes)
		return -ENOTCONN;
	n = dsm_comm_state(comm, dsm_ctl.result, sizeof(dsm_ctl.result));
	scnprintf(dsm_ctl.result + n, sizeof(dsm_ctl.result) - n, "\n");
	return 0;
}

static int dsm_cmd_run(char *cmd, char *args)
{
	u32 a, b;

	if (!strcmp(cmd, "open"))
		return dsm_cmd_open(args);
	if (!strcmp(cmd, "connect"))
		return dsm_cmd_connect(args);
	if (!strcmp(cmd, "stats"))
		return dsm_cmd_stats();
	if (!strcmp(cmd, "state"))
		return dsm_cmd_state();
	if (!strcmp(cmd, "devices"))
		return ctldev_list(&dsm_ctl);
	if (!strcmp(cmd, "close"))
		return dsm_session_close();
	if (!strcmp(cmd, "config"))
		return dsm_cmd_config(args);
	if (!strcmp(cmd, "defer")) {
		if (kstrtou32(args, 0, &a))
			return -EINVAL;
		dsm_selftest_defer(a);
		return 0;
	}
	if (!strcmp(cmd, "selftest")) {
		if (sscanf(args, "%u %u", &a, &b) != 2)
			return -EINVAL;
		return dsm_selftest(comm, a, b, dsm_ctl.result, sizeof(dsm_ctl.result));
	}
	return -EINVAL;
}

static int dsm_add_one(struct ib_device *dev)
{
	return ctldev_add(&dsm_ctl, dev);
}

/*
 * The device is going: its QPs must go now, even under an application
 * (which then waits for answers that never come, and gets SIGBUS); the
 * space stays until the last file using it closes.
 */
static void dsm_gone(struct ib_device *dev)
{
	if (comm->dev == dev)
		dsm_close(comm, true);
}

/* A device going away (driver unload) takes the DSM's connections along. */
static void dsm_remove_one(struct ib_device *dev, void *data)
{
	ctldev_remove(&dsm_ctl, dev, dsm_gone);
}

static struct ib_client dsm_client = {
	.name = "dsm",
	.add = dsm_add_one,
	.remove = dsm_remove_one,
};

static int __init dsm_init(void)
{
	int err;

	comm = kzalloc(sizeof(*comm), GFP_KERNEL);
	if (!comm)
		return -ENOMEM;
	err = ctldev_register(&dsm_ctl, "dsm_ctl");
	if (err)
		goto err_comm;
	err = dsm_region_init();
	if (err)
		goto err_misc;
	err = ib_register_client(&dsm_client);
	if (err)
		goto err_region;
	return 0;

err_region:
	dsm_region_exit();
err_misc:
	ctldev_deregister(&dsm_ctl);
err_comm:
	kfree(comm);
	return err;
}

static void __exit dsm_exit(void)
{
	ctldev_deregister(&dsm_ctl);
	mutex_lock(&dsm_ctl.lock);
	dsm_close(comm, true);
	mutex_unlock(&dsm_ctl.lock);
	ib_unregister_client(&dsm_client);
	dsm_region_exit();
	kfree(comm);
}

module_init(dsm_init);
module_exit(dsm_exit);
MODULE_DESCRIPTION("hcabench kernel DSM: sequentially consistent shared memory over verbs");
MODULE_LICENSE("GPL");
