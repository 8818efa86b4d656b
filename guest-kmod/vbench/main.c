// SPDX-License-Identifier: GPL-2.0
/*
 * vbench control: /dev/vbench takes one text command per write() and
 * read() returns its result; /dev/vbench_msg is the user-mode message
 * channel (read = next received message, write = send one). The harness
 * (tests, `hcabench bench verbs`) drives both through the guest's shell.
 *
 * Commands: open DEV | connect lid= qpn= psn= rkey= raddr= gid= |
 *   serve poll|isr|wq|user [verify] | stop |
 *   ping poll|isr|wq SIZE ITERS [verify] | bw write|read SIZE ITERS |
 *   badrkey | fastreg | udloop | atomic | cqclean | mad | close | devices |
 *   cm listen PORT | cm wait | cm connect IPV4 PORT  (rdma_cm, cm.c)
 */
#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/inet.h>
#include "vbench.h"
#include "ctldev.h"

struct vb_ctx *vb;
const u8 *vb_pattern;

static int vb_cmd_run(char *cmd, char *args);

/* Its lock serialises commands, the device list, and resource set-up/tear-down. */
static struct ctldev vb_ctl = { .run = vb_cmd_run };

static enum vb_mode vb_parse_mode(const char *s)
{
	if (!strcmp(s, "poll"))
		return VB_POLL;
	if (!strcmp(s, "isr"))
		return VB_ISR;
	if (!strcmp(s, "wq"))
		return VB_WQ;
	if (!strcmp(s, "user"))
		return VB_USER;
	return VB_IDLE;
}

static int vb_parse_peer(char *args, struct vb_peer *p)
{
	char *tok, *val;
	int seen = 0;

	while ((tok = strsep(&args, " ")) != NULL) {
		val = strchr(tok, '=');
		if (!val)
			continue;
		*val++ = '\0';
		if (!strcmp(tok, "lid") && !kstrtou32(val, 0, &p->lid))
			seen |= 1;
		else if (!strcmp(tok, "qpn") && !kstrtou32(val, 0, &p->qpn))
			seen |= 2;
		else if (!strcmp(tok, "psn") && !kstrtou32(val, 0, &p->psn))
			seen |= 4;
		else if (!strcmp(tok, "rkey") && !kstrtou32(val, 0, &p->rkey))
			seen |= 8;
		else if (!strcmp(tok, "raddr") && !kstrtou64(val, 0, &p->raddr))
			seen |= 16;
		else if (!strcmp(tok, "gid") &&
			 in6_pton(val, -1, p->gid.raw, -1, NULL))
			seen |= 32;
	}
	return seen == 63 ? 0 : -EINVAL;
}

static int vb_cmd_open(const char *name)
{
	struct ib_device *dev = ctldev_find(&vb_ctl, name);

	if (!dev)
		return -ENODEV;
	return vb_open(dev) ?: vb_addr(vb_ctl.result, sizeof(vb_ctl.result));
}

/* cm listen PORT | cm wait | cm connect IPV4 PORT */
static int vb_cmd_cm(char *args)
{
	char op[8] = "", addr[16] = "";
	u16 port;

	if (sscanf(args, "%7s", op) != 1)
		return -EINVAL;
	if (!strcmp(op, "listen") && sscanf(args, "%*s %hu", &port) == 1)
		return vb_cm_listen(port);
	if (!strcmp(op, "wait"))
		return vb_cm_wait(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(op, "connect") && sscanf(args, "%*s %15s %hu", addr, &port) == 2)
		return vb_cm_connect(addr, port) ?:
		       scnprintf(vb_ctl.result, sizeof(vb_ctl.result),
				 "connected qpn=%u peer_rkey=%u\n", vb->qp->qp_num,
				 vb->peer.rkey);
	return -EINVAL;
}

static int vb_cmd_run(char *cmd, char *args)
{
	char a[8] = "", b[8] = "";
	u32 size = 0, iters = 0;
	struct vb_peer peer = {};
	enum vb_mode mode;

	if (!strcmp(cmd, "open"))
		return vb_cmd_open(args);
	if (!strcmp(cmd, "devices"))
		return ctldev_list(&vb_ctl);
	if (!strcmp(cmd, "close")) {
		vb_close();
		vb_cm_close_listener();
		return 0;
	}
	if (!strcmp(cmd, "cm"))
		return vb_cmd_cm(args);
	if (!strcmp(cmd, "stop")) {
		vb_stop();
		return scnprintf(vb_ctl.result, sizeof(vb_ctl.result),
				 "served=%u errors=%u deferred=%u\n",
				 vb->done, vb->errors, vb->deferred);
	}
	if (!strcmp(cmd, "badrkey"))
		return vb_badrkey(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "fastreg"))
		return vb_fastreg(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "atomic"))
		return vb_atomic(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "cqclean"))
		return vb_cqclean(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "udloop"))
		return vb_udloop(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "mad"))
		return vb_mad(vb_ctl.result, sizeof(vb_ctl.result));
	if (!strcmp(cmd, "connect"))
		return vb_parse_peer(args, &peer) ?: vb_connect(&peer);
	if (!strcmp(cmd, "serve")) {
		if (sscanf(args, "%7s %7s", a, b) < 1 || !(mode = vb_parse_mode(a)))
			return -EINVAL;
		vb->verify = !strcmp(b, "verify");
		return vb_serve(mode);
	}
	if (!strcmp(cmd, "ping")) {
		if (sscanf(args, "%7s %u %u %7s", a, &size, &iters, b) < 3 ||
		    !(mode = vb_parse_mode(a)))
			return -EINVAL;
		vb->verify = !strcmp(b, "verify");
		return vb_ping(mode, size, iters, vb_ctl.result, sizeof(vb_ctl.result));
	}
	if (!strcmp(cmd, "bw")) {
		if (sscanf(args, "%7s %u %u", a, &size, &iters) != 3 ||
		    (strcmp(a, "read") && strcmp(a, "write")))
			return -EINVAL;
		return vb_bw(!strcmp(a, "read"), size, iters, vb_ctl.result,
			     sizeof(vb_ctl.result));
	}
	return -EINVAL;
}

static ssize_t vb_msg_read(struct file *f, char __user *ubuf, size_t len,
			   loff_t *pos)
{
	return vb_user_read(ubuf, len);
}

static ssize_t vb_msg_write(struct file *f, const char __user *ubuf, size_t len,
			    loff_t *pos)
{
	return vb_user_write(ubuf, len);
}

static const struct file_operations vb_msg_fops = {
	.owner = THIS_MODULE,
	.write = vb_msg_write,
	.read = vb_msg_read,
	.llseek = noop_llseek,
};

static struct miscdevice vb_msg_dev = {
	.minor = MISC_DYNAMIC_MINOR, .name = "vbench_msg", .fops = &vb_msg_fops,
};

static int vb_add_one(struct ib_device *dev)
{
	return ctldev_add(&vb_ctl, dev);
}

static void vb_gone(struct ib_device *dev)
{
	if (vb->dev == dev)
		vb_close();
}

/* A device going away (driver unload) takes our resources on it along. */
static void vb_remove_one(struct ib_device *dev, void *data)
{
	ctldev_remove(&vb_ctl, dev, vb_gone);
}

static struct ib_client vb_client = {
	.name = "vbench",
	.add = vb_add_one,
	.remove = vb_remove_one,
};

static int vb_init_ctx(void)
{
	u8 *pat;
	int i;

	vb = kzalloc(sizeof(*vb), GFP_KERNEL);
	pat = kmalloc(VB_MAX_MSG, GFP_KERNEL);
	if (!vb || !pat)
		goto err;
	for (i = 0; i < VB_MAX_MSG; i++)
		pat[i] = (u8)(i * 131 + 7);
	vb_pattern = pat;
	vb->wq = alloc_workqueue("vbench", WQ_HIGHPRI, 1);
	if (!vb->wq)
		goto err;
	INIT_WORK(&vb->work, vb_work_fn);
	init_completion(&vb->finished);
	init_waitqueue_head(&vb->waitq);
	return 0;
err:
	kfree(pat);
	kfree(vb);
	return -ENOMEM;
}

static void vb_free_ctx(void)
{
	destroy_workqueue(vb->wq);
	kvfree(vb->samples);
	kfree(vb_pattern);
	kfree(vb);
}

static int __init vb_init(void)
{
	int err = vb_init_ctx();

	if (err)
		return err;
	err = ctldev_register(&vb_ctl, "vbench");
	if (err)
		goto err_ctx;
	vb_cm_init(&vb_ctl.lock);
	err = misc_register(&vb_msg_dev);
	if (err)
		goto err_ctl;
	err = ib_register_client(&vb_client);
	if (err)
		goto err_msg;
	return 0;

err_msg:
	misc_deregister(&vb_msg_dev);
err_ctl:
	ctldev_deregister(&vb_ctl);
err_ctx:
	vb_free_ctx();
	return err;
}

static void __exit vb_exit(void)
{
	misc_deregister(&vb_msg_dev);
	ctldev_deregister(&vb_ctl);
	mutex_lock(&vb_ctl.lock);
	vb_close();
	vb_cm_close_listener();
	mutex_unlock(&vb_ctl.lock);
	ib_unregister_client(&vb_client);
	vb_free_ctx();
}

module_init(vb_init);
module_exit(vb_exit);
MODULE_DESCRIPTION("Kernel verbs ping-pong and RDMA bandwidth benchmark");
MODULE_LICENSE("GPL");
