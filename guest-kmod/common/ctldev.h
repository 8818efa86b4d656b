/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ctldev: the text control devices of guest-kmod's consumers (/dev/vbench,
 * /dev/dsm_ctl): one command per write(), its result from read(), and the
 * ib_devices the module's ib_client has been told about, by name.
 * Compiled into each module that uses it.
 */
#ifndef CTLDEV_H
#define CTLDEV_H

#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mutex.h>
#include <rdma/ib_verbs.h>

#define CTLDEV_RESULT	2048
#define CTLDEV_DEVS	8

struct ctldev {
	struct miscdevice misc;	/* /dev/<name>; ctldev_register fills it */
	/* Serialises commands and the device list; held while run() runs. */
	struct mutex lock;
	/* Runs "cmd args"; writes its answer to result, or returns < 0. */
	int (*run)(char *cmd, char *args);
	char result[CTLDEV_RESULT];
	struct ib_device *devs[CTLDEV_DEVS];
};

/* Creates /dev/<name> (which must outlive the registration) for c. */
int ctldev_register(struct ctldev *c, const char *name);
void ctldev_deregister(struct ctldev *c);
/* ib_client add/remove helpers; remove calls gone(dev) under the lock first. */
int ctldev_add(struct ctldev *c, struct ib_device *dev);
void ctldev_remove(struct ctldev *c, struct ib_device *dev,
		   void (*gone)(struct ib_device *dev));
/* Caller holds c->lock (inside run()). */
struct ib_device *ctldev_find(struct ctldev *c, const char *name);
int ctldev_list(struct ctldev *c);

#endif /* CTLDEV_H */
